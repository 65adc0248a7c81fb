// Lint for the labextension's TypeScript: `npm run lint` (tests/test_labextension.py runs it with the type check).
// Flat config: https://eslint.org/docs/latest/use/configure/configuration-files ; rules: https://typescript-eslint.io
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', '../tfgpu_magic/labextension/'] },
  eslint.configs.recommended,
  ...tseslint.configs.strict,
  {
    files: ['src/**/*.ts', 'src/**/*.tsx'],
    rules: {
      eqeqeq: 'error',
      'no-restricted-properties': [
        'error',
        { property: 'innerHTML', message: 'Set textContent: names come from users (notebook paths).' },
        { property: 'outerHTML', message: 'Set textContent: names come from users (notebook paths).' }
      ],
      'no-restricted-syntax': [
        'error',
        { selector: "CallExpression[callee.property.name='insertAdjacentHTML']", message: 'Build DOM nodes, set textContent.' }
      ],
      '@typescript-eslint/explicit-function-return-type': 'error'
    }
  }
);
