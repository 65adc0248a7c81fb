/**
 * The server extension's replies (tfgpu_magic/serverext/gather.py builds them) and how to ask for them:
 * through the server's own connection settings, so its authentication (token, XSRF cookie) applies.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** One process on a card. Other users' processes carry pid, user and memory only. */
export interface IGpuProcess {
  pid: number;
  user: string | null;
  mine: boolean;
  gpu_memory: number | null;
  kernel_id?: string;
  notebook?: string | null;
  execution_state?: string | null;
  idle_seconds?: number | null;
  tensorflow?: string | null;
}

/** One card, in nvidia-smi order. Memory in bytes. */
export interface IGpu {
  index: number;
  name: string | null;
  uuid: string;
  memory_total: number | null;
  memory_used: number | null;
  utilization: number | null;
  mig: string[];
  processes: IGpuProcess[];
}

/** `GET /api/tfgpu/gpus`; `error` says why there are no cards (no NVML). */
export interface IGpusReply {
  gpus: IGpu[];
  error: string | null;
}

/** A card as the kernel's status names it, with what this kernel holds on it. */
export interface IKernelGpu {
  index: number;
  name: string | null;
  memory_total: number | null;
  kernel_memory: number | null;
}

/** `GET /api/tfgpu/kernels/<id>`: answered from what the kernel published, busy or not. */
export interface IKernelReply {
  kernel_id: string;
  notebook: string | null;
  execution_state: string | null;
  idle_seconds: number | null;
  tensorflow: string | null;
  pid: number | null;
  published: boolean;
  settings: string[];
  policy_text: string[];
  tensorflow_label: string | null;
  initialized_by: string | null;
  pending: { title: string; items: string[] }[];
  restart_needed: boolean;
  gpus_from: 'policy' | 'memory' | 'all';
  gpus: IKernelGpu[];
  gpu_error: string | null;
}

/** GET `api/tfgpu/<path>` as JSON; throws `ServerConnection.ResponseError` on an HTTP error. */
export async function requestAPI<T>(path: string): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'api', 'tfgpu', path);
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as T;
}
