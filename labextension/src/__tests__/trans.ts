/**
 * The bundle the tests word with: JupyterLab's own `nullTranslator` (the English text, `%1` filled in),
 * the one a page without a language pack gets.
 */
import { TranslationBundle, nullTranslator } from '@jupyterlab/translation';

export const trans: TranslationBundle = nullTranslator.load('tfgpu_magic');
