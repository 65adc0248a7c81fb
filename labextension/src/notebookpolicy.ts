/**
 * "Save GPU Policy to Notebook Metadata" (`tfgpu:save-policy-to-notebook`): the kernel's current GPU
 * policy goes into the notebook's `metadata.tfgpu.policy`, a list of `%%tfgpu` directive lines
 * (`["visible auto:1", "growth on"]`), so the notebook carries it: the tfgpu kernel provisioner applies
 * it when the notebook's kernel starts (tfgpu_magic/jupyter/notebook_request.py reads it).
 *
 * The lines come from the server (`directives` of `GET /api/tfgpu/kernels/<id>`, written by the Python
 * side's one grammar), never made here; the server answers from what the kernel published, so the
 * command works while a cell runs. Only `metadata.tfgpu.policy` changes (other keys under `tfgpu` and
 * all other metadata stay); the notebook is then modified, and the user saves it as usual.
 */
import { showErrorMessage } from '@jupyterlab/apputils';
import type { NotebookPanel } from '@jupyterlab/notebook';
import type { TranslationBundle } from '@jupyterlab/translation';

import { RequestFailure, getKernel } from './api';
import { failureText } from './words';

export const SAVE_POLICY_COMMAND = 'tfgpu:save-policy-to-notebook';
/** `metadata.tfgpu.policy`: the keys tfgpu_magic/jupyter/notebook_request.py reads (`METADATA_KEY`, `POLICY_KEY`). */
export const METADATA_KEY = 'tfgpu';
export const POLICY_KEY = 'policy';

/** The lines the server gives for `kernelId`'s published policy, or why there are none (one sentence). */
async function policyLines(trans: TranslationBundle, kernelId: string): Promise<string[] | string> {
  try {
    const reply = await getKernel(kernelId);
    if (!reply.published) {
      return trans.__('tfgpu_magic is not loaded in this kernel (run %load_ext tfgpu_magic, or any %tfgpu line).');
    }
    if (!Array.isArray(reply.directives)) {
      return reply.error?.message ?? trans.__('The server gave no directive lines for this kernel (an older tfgpu_magic?).');
    }
    return reply.directives;
  } catch (reason) {
    if (reason instanceof RequestFailure) {
      const text = failureText(trans, reason);
      return [text.what, text.fix].filter(part => part).join(' ');
    }
    return String(reason);
  }
}

/** Put the kernel's policy into `panel`'s notebook metadata; whether it was. */
export async function savePolicyToNotebook(panel: NotebookPanel, trans: TranslationBundle): Promise<boolean> {
  const kernel = panel.sessionContext.session?.kernel ?? null;
  const model = panel.model;
  if (kernel === null || model === null) {
    await showErrorMessage(trans.__('GPU policy not saved'), trans.__('The notebook has no kernel.'));
    return false;
  }
  const lines = await policyLines(trans, kernel.id);
  if (typeof lines === 'string') {
    await showErrorMessage(trans.__('GPU policy not saved'), lines);
    return false;
  }
  const current = model.getMetadata(METADATA_KEY);
  const ours: Record<string, unknown> =
    current !== null && typeof current === 'object' && !Array.isArray(current) ? { ...current } : {};
  ours[POLICY_KEY] = lines;
  model.setMetadata(METADATA_KEY, ours);
  return true;
}
