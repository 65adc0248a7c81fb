/**
 * The server extension's replies and how to ask for them. The types follow the contract both sides
 * share, tfgpu_magic/jupyter/tfgpu-state.schema.json (`$defs/gpusReply`, `$defs/kernelReply`,
 * `$defs/keepReply`): data only, memory in bytes, states as enums; English only in an error's `message`.
 * Requests go through the server's own connection settings, so its authentication applies (token,
 * XSRF cookie on the POST). A failed request becomes a `RequestFailure` saying which kind of failure.
 * The types are generated from the schema (`schema.ts`, `npm run schema`); the names here are the ones
 * the views use. Each request says which version of the schema the browser speaks, and each reply's
 * `format` and `version` are compared with the browser's, so a browser and a server of different versions
 * say which is older instead of misreading each other.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ERROR_CODES, FORMATS, SCHEMA_VERSION, VERSION_HEADER } from './schema';
import type * as schema from './schema';

/** `$defs/tensorflowState`. */
export type TensorFlowState = schema.TensorflowState;
/** `$defs/errorCode`: what an error is; the browser words it (words.ts `errorText`). */
export type ErrorCode = schema.ErrorCode;
/** `$defs/error`: `message` is English for a tooltip; the browser words `code`. */
export type IReplyError = schema.Error;
/** `$defs/gpuStatus`: how far the GPU figures can be trusted. */
export type IGpuStatus = schema.GpuStatus;
/** `$defs/kernelRef`: a kernel of this server. */
export type IKernelRef = schema.KernelRef;
/** `$defs/gpuProcess`. */
export type IGpuProcess = schema.GpuProcess;
/** `$defs/gpu`: one card, in nvidia-smi order. */
export type IGpu = schema.Gpu;
/** `$defs/gpusReply`: `GET /api/tfgpu/gpus`. */
export type IGpusReply = schema.GpusReply;
/** `$defs/logicalDevice`. */
export type ILogicalDevice = schema.LogicalDevice;
/** `$defs/settingValue`. */
export type SettingValue = schema.SettingValue;
/** `$defs/lockReason`: why a change waits for a restart. */
export type LockReason = schema.LockReason;
/** `$defs/pendingChange`: a setting TensorFlow (or CUDA) has not taken. */
export type IPendingChange = schema.PendingChange;
/** `$defs/policy`: null or empty fields are TensorFlow's defaults. */
export type IPolicy = schema.Policy;
/** `$defs/tensorflow`/`initialized_by`. */
export type IInitializedBy = NonNullable<schema.Tensorflow['initialized_by']>;
/** `$defs/tensorflow`: what the kernel published about TensorFlow. */
export type ITensorFlow = schema.Tensorflow;
/** `$defs/framework`: JAX or PyTorch in the kernel. */
export type IFramework = schema.Framework;
/** `$defs/framework`/`state`. */
export type FrameworkState = IFramework['state'];
/** `$defs/framework`/`variables`. */
export type IFrameworkVariable = IFramework['variables'][number];
/** `$defs/framework`/`fractions`. */
export type IFrameworkFraction = IFramework['fractions'][number];
/** `$defs/framework`/`memory`. */
export type IFrameworkMemory = IFramework['memory'][number];
/** `$defs/frameworks`: the other frameworks in the kernel (null: not imported and told nothing). */
export type IFrameworks = schema.Frameworks;
/** `$defs/frameworks`/`keras`: Keras 3's backend. */
export type IKeras = NonNullable<IFrameworks['keras']>;
/** `$defs/frameworks`/`keras`/`source`. */
export type KerasBackendSource = IKeras['source'];
/** `$defs/kernelGpu`. */
export type IKernelGpu = schema.KernelGpu;
/** `$defs/kernelReply`: `GET /api/tfgpu/kernels/<id>`, answered busy or not. */
export type IKernelReply = schema.KernelReply;
/** `$defs/cellRun`: one cell the kernel ran; a cell is the same cell as one seen before with the same `start`. */
export type ICellRun = schema.CellRun;
/** `$defs/memorySeries`. */
export type IMemorySeries = schema.MemorySeries;
/** `$defs/memorySeries`/`source`. */
export type MemorySource = IMemorySeries['source'];
/** `$defs/memorySeries`/`figure`. */
export type MemoryFigure = IMemorySeries['figure'];
/** `$defs/memoryHistory`: the kernel's GPU memory over time, columnar, only what is new after `since`
 * (append it, pass `next_since` to the next `getKernel`, merge `cells` by `start`). */
export type IMemoryHistory = schema.MemoryHistory;
/** `$defs/keepReply`: `POST /api/tfgpu/kernels/<id>/keep`. */
export type IKeepReply = schema.KeepReply;

/**
 * Why a request gave no reply: `extension-missing` (the server answers, but has no /api/tfgpu: the
 * server extension is off or not installed), `server-gone` (no answer at all), `failed` (any other
 * refusal: its error body's `code` says which), `unknown-kernel` (the server extension does not know this
 * kernel: it just started), `server-older` and `browser-older` (the two speak different versions of the schema: which is older).
 */
export type FailureKind = 'extension-missing' | 'server-gone' | 'failed' | 'unknown-kernel' | 'server-older' | 'browser-older';

/** A request that gave no reply, with its kind, the HTTP status where there was one, the detail (English,
 * for a tooltip), and the code of the server's error body (`$defs/error`) where it sent one: the views word
 * that code, and the HTTP status only where the body was not the schema's error (words.ts `failureText`). */
export class RequestFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    readonly status: number | null,
    detail: string,
    readonly code: ErrorCode | null = null
  ) {
    super(detail);
  }
}

/** Which side is older, from the other side's version (`null`: unreadable, taken as older than ours). */
function olderSide(theirs: number | null): FailureKind {
  return theirs !== null && theirs > SCHEMA_VERSION ? 'browser-older' : 'server-older';
}

/** The version a reply is of: its `version`; a server of a version before 4 sent none, and ended its
 * `format` in its version instead (`<format>/<version>`); null where neither says. */
function replyVersion(reply: { format?: unknown; version?: unknown }): number | null {
  if (typeof reply.version === 'number') {
    return reply.version;
  }
  const last = typeof reply.format === 'string' ? (reply.format.split('/').pop() ?? '') : '';
  return /^\d+$/.test(last) ? Number(last) : null;
}

/** `body` where it is the schema's error (`$defs/error`: a code the schema names, English in `message`); null
 * for any other body: a proxy's HTML page, an empty body, JSON of another shape. */
function errorBody(body: unknown): IReplyError | null {
  if (typeof body !== 'object' || body === null) {
    return null;
  }
  const { code, message } = body as { code?: unknown; message?: unknown };
  const known = typeof code === 'string' && (ERROR_CODES as readonly string[]).includes(code);
  return known && typeof message === 'string' ? (body as IReplyError) : null;
}

/** `api/tfgpu/<path>` on this server. */
function apiUrl(settings: ServerConnection.ISettings, path: string): string {
  return URLExt.join(settings.baseUrl, 'api', 'tfgpu', path);
}

/**
 * The failure an HTTP error reply stands for, by the code of its body: every error of the server
 * extension's handlers is `$defs/error`. Only a body that is not one is taken by its HTTP status: a 404 is
 * then the server's own page for a path no handler serves (`Template404`): the extension is missing.
 */
async function failureOf(response: Response): Promise<RequestFailure> {
  let body: unknown = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page, an empty body): not the extension's error
  }
  const error = errorBody(body);
  if (error === null) {
    const detail = `${response.status} ${response.statusText}`.trim();
    return new RequestFailure(response.status === 404 ? 'extension-missing' : 'failed', response.status, detail);
  }
  const kind =
    error.code === 'version_mismatch'
      ? olderSide(error.server_version ?? null)
      : error.code === 'unknown_kernel'
        ? 'unknown-kernel'
        : 'failed';
  return new RequestFailure(kind, response.status, error.message, error.code);
}

/** `method` `api/tfgpu/<path>` (and `query`, `?...`, outside the path), the JSON reply of `format`; a
 * `RequestFailure` when there is none, or when it is of another version of the schema. */
async function request<T>(path: string, format: string, init: RequestInit = {}, query = ''): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const headers = new Headers(init.headers);
  headers.set(VERSION_HEADER, String(SCHEMA_VERSION));
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(apiUrl(settings, path) + query, { ...init, headers }, settings);
  } catch (reason) {
    throw new RequestFailure('server-gone', null, String(reason));
  }
  if (!response.ok) {
    throw await failureOf(response);
  }
  let reply: { format?: unknown; version?: unknown };
  try {
    reply = ((await response.json()) ?? {}) as { format?: unknown; version?: unknown };
  } catch (reason) {
    throw new RequestFailure('failed', response.status, String(reason));
  }
  if (reply.format !== format || reply.version !== SCHEMA_VERSION) {
    const theirs = replyVersion(reply);
    const detail =
      `the server answered ${String(reply.format).slice(0, 80)} version ${theirs ?? '?'}, ` +
      `this page reads ${format} version ${SCHEMA_VERSION}`;
    throw new RequestFailure(olderSide(theirs), response.status, detail, 'version_mismatch');
  }
  return reply as T;
}

/** `GET /api/tfgpu/gpus`. */
export function getGpus(): Promise<IGpusReply> {
  return request<IGpusReply>('gpus', FORMATS.gpusReply);
}

/** `GET /api/tfgpu/kernels/<id>`; with `since` (the last reply's `history.next_since`), the history
 * carries only what is new, so a poll does not grow with the history. */
export function getKernel(kernelId: string, since: number | null = null): Promise<IKernelReply> {
  const query = since === null ? '' : `?since=${encodeURIComponent(String(since))}`;
  return request<IKernelReply>(`kernels/${encodeURIComponent(kernelId)}`, FORMATS.kernelReply, {}, query);
}

/** `POST /api/tfgpu/kernels/<id>/keep`: the server stores the policy the kernel published for the next
 * kernel on its connection file. `makeRequest` adds the XSRF header the server checks on a POST. */
export function keepPolicy(kernelId: string): Promise<IKeepReply> {
  return request<IKeepReply>(`kernels/${encodeURIComponent(kernelId)}/keep`, FORMATS.keepReply, {
    method: 'POST',
    body: '{}'
  });
}
