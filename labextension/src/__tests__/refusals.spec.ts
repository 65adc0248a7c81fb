/**
 * A refused request is worded by its error body's `code` (`$defs/error`, the body of every reply of the
 * server extension that is not 200), never by its HTTP status; the status is worded only where the body is
 * not the schema's error (a proxy's HTML page, an empty body, JSON of another shape). The network is
 * replaced at `ServerConnection.makeRequest` (a real `Response`), so each reply goes the real way: api.ts
 * `request` and `failureOf`, the model (`GpuModel`, the real `Poll`), words.ts and problems.ts.
 * Each code is sent under a status that is not its own too: a view that words the status fails here.
 */
import contract from '../../../tfgpu_magic/jupyter/tfgpu-state.schema.json';

jest.mock('@jupyterlab/ui-components', () => jest.requireActual('./vdommodel'));
jest.mock('@jupyterlab/services', () => ({
  ServerConnection: { makeSettings: (): { baseUrl: string } => ({ baseUrl: 'http://localhost:8888/' }), makeRequest: jest.fn() }
}));

import { ServerConnection } from '@jupyterlab/services';

import { ErrorCode, RequestFailure, getGpus, keepPolicy } from '../api';
import { GpuModel, IDemand } from '../model';
import { problems } from '../problems';
import { FORMATS, SCHEMA_VERSION } from '../schema';
import { errorShort, errorText, failureShort, failureText } from '../words';
import { trans } from './trans';

const makeRequest = ServerConnection.makeRequest as jest.MockedFunction<typeof ServerConnection.makeRequest>;
const CODES = contract.$defs.errorCode.enum as ErrorCode[];
/** Codes the browser turns into a failure of its own kind (worded by that kind: which side is older, a kernel
 * the server does not know yet); every other code is a `failed` request worded by the code. */
const OWN_KINDS: ErrorCode[] = ['version_mismatch', 'unknown_kernel'];
const HTTP_WORDS = /HTTP/;

/** The server answers every request with `status` and `body` (JSON where not a string). */
function answers(status: number, body: unknown, contentType = 'application/json'): void {
  makeRequest.mockImplementation(() =>
    Promise.resolve(
      new Response(typeof body === 'string' ? body : JSON.stringify(body), {
        status,
        headers: { 'Content-Type': contentType }
      })
    )
  );
}

/** The failure `GET /api/tfgpu/gpus` gives. */
async function refusal(status: number, body: unknown, contentType?: string): Promise<RequestFailure> {
  answers(status, body, contentType);
  const failure = await getGpus().then(
    () => null,
    (reason: unknown) => reason
  );
  expect(failure).toBeInstanceOf(RequestFailure);
  return failure as RequestFailure;
}

/** The status bar's words for `failure` (never a kernel not known yet: the model keeps no such failure). */
function short(failure: RequestFailure): string {
  expect(failure.kind).not.toBe('unknown-kernel');
  return failureShort(trans, failure as Parameters<typeof failureShort>[1]);
}

beforeEach(() => {
  makeRequest.mockReset();
});

describe('a refusal in the schema error shape is worded by its code', () => {
  it('words a 403 `forbidden` as not allowed, with the fix to log in', async () => {
    const failure = await refusal(403, { code: 'forbidden', message: 'Forbidden' });
    expect([failure.kind, failure.status, failure.code]).toEqual(['failed', 403, 'forbidden']);
    expect(failureText(trans, failure)).toEqual({
      what: 'The Jupyter server refused the GPU request: not logged in, or not allowed.',
      fix: 'Log in again, then reload this page.'
    });
    expect(short(failure)).toBe('GPU: not allowed');
  });

  it('words a 500 `server_error` as a failure in the server, with its log as the fix', async () => {
    const failure = await refusal(500, { code: 'server_error', message: 'Unhandled error' });
    expect(failureText(trans, failure)).toEqual({
      what: 'The GPU request failed in the Jupyter server.',
      fix: "The Jupyter server's log says why."
    });
    expect(short(failure)).toBe('GPU: server error');
  });

  it.each(CODES.filter(code => !OWN_KINDS.includes(code)))(
    'words %s by the code, whatever the status',
    async code => {
      for (const status of [400, 403, 409, 500]) {
        const failure = await refusal(status, { code, message: `the server's English for ${code}` });
        expect(failure.code).toBe(code);
        expect(failure.message).toBe(`the server's English for ${code}`); // the tooltip
        expect(failureText(trans, failure)).toEqual(errorText(trans, code));
        expect(short(failure)).toBe(`GPU: ${errorShort(trans, code)}`);
        expect(failureText(trans, failure).what).not.toMatch(HTTP_WORDS);
      }
    }
  );

  it('words `version_mismatch` by which side is older, from the server version in the body', async () => {
    const newer = await refusal(409, {
      code: 'version_mismatch',
      message: 'another version',
      server_version: SCHEMA_VERSION + 1,
      client_version: SCHEMA_VERSION
    });
    expect(newer.kind).toBe('browser-older');
    expect(failureText(trans, newer).what).toMatch(/^This page's tfgpu_magic extension is older/);
    const older = await refusal(409, { code: 'version_mismatch', message: 'another version', server_version: null });
    expect(older.kind).toBe('server-older');
  });

  it('takes `unknown_kernel` as a kernel not known yet, and a 404 without the error shape as no extension', async () => {
    answers(404, { code: 'unknown_kernel', message: 'this server has no kernel k1' });
    const unknown = (await keepPolicy('k1').catch((reason: unknown) => reason)) as RequestFailure;
    expect(unknown.kind).toBe('unknown-kernel');
    for (const body of ['<html><body>404: Not Found</body></html>', { message: 'Not Found' }]) {
      const missing = await refusal(404, body, typeof body === 'string' ? 'text/html' : undefined);
      expect([missing.kind, missing.code]).toEqual(['extension-missing', null]);
    }
    // the error shape, under a status that is not the code's own: the code decides
    expect((await refusal(500, { code: 'unknown_kernel', message: 'gone' })).kind).toBe('unknown-kernel');
    expect((await refusal(404, { code: 'forbidden', message: 'no' })).kind).toBe('failed');
  });
});

describe('a body not in the error shape is worded by the HTTP status', () => {
  it.each([
    ['a proxy page', 502, '<html><body>Bad Gateway</body></html>', 'text/html'],
    ['an empty body', 500, '', 'application/json'],
    ['JSON of another shape', 500, '{"message": "Internal Server Error"}', 'application/json'],
    ['a code the schema does not name', 418, '{"code": "teapot", "message": "short and stout"}', 'application/json'],
    ['a code without its message', 403, '{"code": "forbidden"}', 'application/json'],
    ['a JSON string', 503, '"forbidden"', 'application/json']
  ])('%s (%p)', async (_, status, body, contentType) => {
    const failure = await refusal(status, body, contentType);
    expect([failure.kind, failure.status, failure.code]).toEqual(['failed', status, null]);
    expect(failureText(trans, failure)).toEqual({
      what: `The GPU request failed (HTTP ${status}).`,
      fix: "The Jupyter server's log says why."
    });
    expect(short(failure)).toBe(`GPU: request failed (HTTP ${status})`);
  });
});

describe('the sidebar and the status item word the model failure by its code', () => {
  let model: GpuModel | null = null;

  beforeEach(() => {
    jest.useFakeTimers();
  });

  afterEach(() => {
    model?.dispose();
    model = null;
    jest.useRealTimers();
  });

  it('keeps the code of a refusal and words it, and the status of a proxy page', async () => {
    answers(403, { code: 'forbidden', message: 'Forbidden' });
    model = new GpuModel({ refreshRate: 1000, demand: (): IDemand => ({ kernelId: null, gpus: true }) });
    await jest.advanceTimersByTimeAsync(100); // the poll's first tick
    expect(model.failure).toMatchObject({ kind: 'failed', status: 403, code: 'forbidden', detail: 'Forbidden' });
    const [shown] = problems(trans, model, null, true);
    expect(shown).toMatchObject({ key: 'failure-failed', what: errorText(trans, 'forbidden').what, detail: 'Forbidden' });
    expect(model.failure && failureShort(trans, model.failure)).toBe('GPU: not allowed');

    answers(502, '<html>Bad Gateway</html>', 'text/html');
    await jest.advanceTimersByTimeAsync(120_000); // the next probe, backing off
    expect(model.failure).toMatchObject({ kind: 'failed', status: 502, code: null });
    expect(problems(trans, model, null, true)[0].what).toBe('The GPU request failed (HTTP 502).');
  });
});

describe('a reply of another version of the schema', () => {
  it.each([
    ['of a server up to version 3, its version ending its format', { format: `${FORMATS.gpusReply}/3` }, 'server-older'],
    ['of a newer server', { format: FORMATS.gpusReply, version: SCHEMA_VERSION + 1 }, 'browser-older'],
    ['of an older server', { format: FORMATS.gpusReply, version: SCHEMA_VERSION - 1 }, 'server-older'],
    ['without a version', { format: FORMATS.gpusReply }, 'server-older']
  ])('is refused: %s', async (_, stamp, kind) => {
    const failure = await refusal(200, { ...stamp, gpus: [], gpu_status: { error: null, stale_seconds: null, host_pids: false } });
    expect([failure.kind, failure.code]).toEqual([kind, 'version_mismatch']);
  });

  it('of this version is read', async () => {
    answers(200, { format: FORMATS.gpusReply, version: SCHEMA_VERSION, gpus: [], gpu_status: {} });
    await expect(getGpus()).resolves.toMatchObject({ version: SCHEMA_VERSION, gpus: [] });
  });
});
