/**
 * Jest for the pure logic in src/ (sizes, words, the history buffer, the chart's text, the model's
 * failure budget and standby), as JupyterLab's extension template runs it (`npm test`, tests in
 * src/__tests__/*.spec.ts). TypeScript goes through ts-jest with tsconfig.test.json; JupyterLab's
 * packages ship ES modules, so the few the tests load are compiled too (transformIgnorePatterns). Each file
 * is transpiled alone (tsconfig.test.json's isolatedModules): `npm run check` checks the types (tests/test_labextension.py).
 * The page itself is tested in a real JupyterLab by tests/test_labextension.py.
 */
const esModules = ['@jupyterlab/', '@lumino/', '@jupyter/'].join('|');

module.exports = {
  testEnvironment: 'node',
  testRegex: 'src/.*/.*\\.spec\\.tsx?$',
  testPathIgnorePatterns: ['/lib/', '/node_modules/'],
  transform: {
    '^.+\\.[tj]sx?$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  },
  transformIgnorePatterns: [`/node_modules/(?!${esModules}).+`],
  collectCoverageFrom: ['src/**/*.{ts,tsx}', '!src/**/*.d.ts'],
  coverageReporters: ['text-summary']
};
