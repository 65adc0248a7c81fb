/**
 * The server extension's replies and how to ask for them. The types follow the contract both sides
 * share, tfgpu_magic/jupyter/tfgpu-state.schema.json (`$defs/gpusReply`, `$defs/kernelReply`,
 * `$defs/keepReply`): data only, memory in bytes, states as enums; English only in an error's `message`.
 * Requests go through the server's own connection settings, so its authentication applies (token,
 * XSRF cookie on the POST). A failed request becomes a `RequestFailure` saying which kind of failure.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** `$defs/tensorflowState`. */
export type TensorFlowState = 'not_imported' | 'imported' | 'initialized';

/** `$defs/error/code`. */
export type ErrorCode =
  | 'nvml_missing'
  | 'no_driver'
  | 'nvml_failed'
  | 'driver_not_answering'
  | 'state_invalid';

/** `$defs/error`: `message` is English for a tooltip; the browser words `code`. */
export interface IReplyError {
  code: ErrorCode;
  message: string;
}

/** `$defs/gpuStatus`: how far the GPU figures can be trusted. */
export interface IGpuStatus {
  error: IReplyError | null;
  stale_seconds: number | null;
  host_pids: boolean;
}

/** `$defs/kernelRef`: a kernel of this server. */
export interface IKernelRef {
  kernel_id: string;
  notebook: string | null;
  execution_state: string | null;
  idle_seconds: number | null;
  tensorflow: TensorFlowState | null;
}

/** `$defs/gpuProcess`. */
export interface IGpuProcess {
  pid: number;
  gpu_memory: number | null;
  memory_source: 'nvml' | 'tensorflow';
  mine: boolean;
  user: string | null;
  kernel: IKernelRef | null;
}

/** `$defs/gpu`: one card, in nvidia-smi order. */
export interface IGpu {
  index: number;
  name: string | null;
  uuid: string;
  memory_total: number | null;
  memory_used: number | null;
  utilization: number | null;
  mig: string[];
  granted: boolean;
  processes: IGpuProcess[];
}

/** `$defs/gpusReply`: `GET /api/tfgpu/gpus`. */
export interface IGpusReply {
  format: string;
  gpus: IGpu[];
  gpu_status: IGpuStatus;
}

/** `$defs/logicalDevice`. */
export interface ILogicalDevice {
  memory: number | null;
  priority?: number | null;
  ordinal?: number | null;
}

/** `$defs/settingValue`. */
export type SettingValue = null | boolean | string | string[] | ILogicalDevice[];

/** `$defs/lockReason`: why a change waits for a restart (`devices_created`: something else created the
 * GPU devices already; `jax_backends`, `torch_cuda`, `torch_import`: another framework read it then). */
export type LockReason =
  | 'initialized'
  | 'import'
  | 'cuda_start'
  | 'allocator_creation'
  | 'devices_created'
  | 'jax_backends'
  | 'torch_cuda'
  | 'torch_import'
  | 'no_call';

/** `$defs/pendingChange`: a setting TensorFlow (or CUDA) has not taken. */
export interface IPendingChange {
  setting: 'visible' | 'logical' | 'cpus' | 'growth' | 'variable';
  device: string;
  now: SettingValue;
  wanted: SettingValue;
  /** null where `%tfgpu apply` can still make it. */
  why: LockReason | null;
  needs_restart: boolean;
}

/** `$defs/policy`: null or empty fields are TensorFlow's defaults. */
export interface IPolicy {
  visible: string[] | null;
  visible_auto: boolean;
  growth: boolean | null;
  limits: { gpu: string; bytes: number; written: string | null }[];
  /** `50%` where `limit 50%` was given for every GPU (each limit's `written` says it too). */
  limits_share: string | null;
  splits: { gpu: string; bytes: number[] }[];
  cpu_devices: number | null;
  allocator: 'bfc' | 'async' | null;
  loglevel: 'debug' | 'info' | 'warning' | 'error' | null;
}

/** `$defs/tensorflow`/`initialized_by`. */
export interface IInitializedBy {
  where: 'cell' | 'outside_cell' | 'before_watch';
  execution_count: number | null;
  line: string | null;
}

/** `$defs/tensorflow`: what the kernel published about TensorFlow. */
export interface ITensorFlow {
  state: TensorFlowState;
  cuda_started: boolean;
  initialized_by: IInitializedBy | null;
  memory: { device: string; card: string | null; current: number; peak: number }[];
}

/** `$defs/framework`/`state`: `started` is JAX's backends or PyTorch's CUDA (what they read then is
 * fixed until a restart). */
export type FrameworkState = 'not_imported' | 'imported' | 'started';

/** `$defs/framework`/`variables`: a variable as set now (imported) or as its import will set it. */
export interface IFrameworkVariable {
  name: string;
  value: string;
}

/** `$defs/framework`/`fractions`: PyTorch's per-process memory fraction of a device (CUDA's index);
 * JAX: one entry, device 0, for every device. */
export interface IFrameworkFraction {
  device: number;
  fraction: number;
}

/** `$defs/framework`/`memory`: the framework's own figures of one device once started (JAX's
 * `memory_stats()`, PyTorch's allocator); `card` is the GPU's UUID where the kernel could place it. */
export interface IFrameworkMemory {
  device: string;
  card: string | null;
  current: number;
  peak: number | null;
  reserved: number | null;
}

/** `$defs/framework`: JAX or PyTorch in the kernel. */
export interface IFramework {
  state: FrameworkState;
  version: string | null;
  variables: IFrameworkVariable[];
  fractions: IFrameworkFraction[];
  memory: IFrameworkMemory[];
}

/** `$defs/frameworks`/`keras`/`source`: `keras` as the imported Keras says, else where the backend it
 * will take comes from. */
export type KerasBackendSource = 'keras' | 'KERAS_BACKEND' | 'keras.json' | 'default';

/** `$defs/frameworks`/`keras`: Keras 3's backend. */
export interface IKeras {
  backend: string;
  source: KerasBackendSource;
}

/** `$defs/frameworks`: the other frameworks in the kernel (null: not imported and told nothing). */
export interface IFrameworks {
  jax: IFramework | null;
  torch: IFramework | null;
  keras: IKeras | null;
}

/** `$defs/kernelGpu`. */
export interface IKernelGpu {
  index: number;
  name: string | null;
  memory_total: number | null;
  kernel_memory: number | null;
  memory_source: 'nvml' | 'tensorflow' | null;
}

/** `$defs/kernelReply`: `GET /api/tfgpu/kernels/<id>`, answered busy or not. */
export interface IKernelReply {
  format: string;
  kernel: IKernelRef;
  pid: number | null;
  published: boolean;
  policy: IPolicy | null;
  tensorflow: ITensorFlow | null;
  pending: IPendingChange[];
  restart_needed: boolean;
  keep: boolean;
  gpus_from: 'policy' | 'memory' | 'all';
  gpus: IKernelGpu[];
  gpu_status: IGpuStatus;
  error: IReplyError | null;
  frameworks: IFrameworks | null;
}

/** `$defs/keepReply`: `POST /api/tfgpu/kernels/<id>/keep`. */
export interface IKeepReply {
  format: string;
  kept: boolean;
}

/**
 * Why a request gave no reply: `extension-missing` (the server answers, but has no /api/tfgpu: the
 * server extension is off or not installed), `server-gone` (no answer at all), `failed` (any other
 * HTTP error), `unknown-kernel` (the server extension does not know this kernel: it just started).
 */
export type FailureKind = 'extension-missing' | 'server-gone' | 'failed' | 'unknown-kernel';

/** A request that gave no reply, with its kind, the HTTP status where there was one, and the detail. */
export class RequestFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    readonly status: number | null,
    detail: string
  ) {
    super(detail);
  }
}

/** `api/tfgpu/<path>` on this server. */
function apiUrl(settings: ServerConnection.ISettings, path: string): string {
  return URLExt.join(settings.baseUrl, 'api', 'tfgpu', path);
}

/**
 * The failure an HTTP error reply stands for. A 404 from the server extension's own handlers is JSON
 * (jupyter_server's `APIHandler.write_error`), one for a path no handler serves is the server's HTML
 * page (`Template404`): the first means an unknown kernel, the second a missing extension.
 */
async function failureOf(response: Response, path: string): Promise<RequestFailure> {
  let detail = `${response.status} ${response.statusText}`.trim();
  const json = (response.headers.get('Content-Type') ?? '').includes('application/json');
  if (json) {
    try {
      const body = (await response.json()) as { message?: unknown };
      if (typeof body.message === 'string') {
        detail = body.message;
      }
    } catch {
      // the status says enough
    }
  }
  if (response.status === 404) {
    const ours = json && path.startsWith('kernels/');
    return new RequestFailure(ours ? 'unknown-kernel' : 'extension-missing', 404, detail);
  }
  return new RequestFailure('failed', response.status, detail);
}

/** `method` `api/tfgpu/<path>`, the JSON reply; a `RequestFailure` when there is none. */
async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(apiUrl(settings, path), init, settings);
  } catch (reason) {
    throw new RequestFailure('server-gone', null, String(reason));
  }
  if (!response.ok) {
    throw await failureOf(response, path);
  }
  try {
    return (await response.json()) as T;
  } catch (reason) {
    throw new RequestFailure('failed', response.status, String(reason));
  }
}

/** `GET /api/tfgpu/gpus`. */
export function getGpus(): Promise<IGpusReply> {
  return request<IGpusReply>('gpus');
}

/** `GET /api/tfgpu/kernels/<id>`. */
export function getKernel(kernelId: string): Promise<IKernelReply> {
  return request<IKernelReply>(`kernels/${encodeURIComponent(kernelId)}`);
}

/** `POST /api/tfgpu/kernels/<id>/keep`: the server stores the policy the kernel published for the next
 * kernel on its connection file. `makeRequest` adds the XSRF header the server checks on a POST. */
export function keepPolicy(kernelId: string): Promise<IKeepReply> {
  return request<IKeepReply>(`kernels/${encodeURIComponent(kernelId)}/keep`, { method: 'POST', body: '{}' });
}
