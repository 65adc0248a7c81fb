/**
 * What the views cannot show, and why: the model's failure, the replies' error codes, no GPU, a server
 * in a container of its own; and how old shown figures are when they are not current.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

import type { IGpuStatus, IReplyError } from './api';
import type { GpuModel, IReceived } from './model';
import { IProblemText, errorText, failureText, hostPidsText } from './words';

/** One problem as the views show it: what, the fix, and the server's own words (a tooltip). */
export interface IProblem extends IProblemText {
  key: string;
  detail: string;
}

/** A reply's error code (`where`: the kernel's state, or the GPU figures) as a problem. */
function errorProblem(trans: TranslationBundle, where: 'kernel' | 'gpu', error: IReplyError): IProblem {
  return { key: `${where}-${error.code}`, ...errorText(trans, error.code), detail: error.message };
}

/** The problems behind what the sidebar (`gpus`: with the cards) or the status item shows. */
export function problems(
  trans: TranslationBundle,
  model: GpuModel,
  kernelId: string | null,
  gpus: boolean
): IProblem[] {
  const found: IProblem[] = [];
  const failure = model.failure;
  if (failure !== null) {
    found.push({ key: `failure-${failure.kind}`, ...failureText(trans, failure), detail: failure.detail });
  }
  const kernel = model.kernel(kernelId)?.reply ?? null;
  if (kernel?.error) {
    found.push(errorProblem(trans, 'kernel', kernel.error));
  }
  const cards = gpus ? (model.gpus?.reply ?? null) : null;
  const status = cards?.gpu_status ?? kernel?.gpu_status ?? null;
  if (status?.error) {
    found.push(errorProblem(trans, 'gpu', status.error));
  } else if (cards !== null && cards.gpus.length === 0) {
    found.push({
      key: 'no-gpu',
      what: trans.__('NVML lists no GPU on this machine.'),
      fix: trans.__('Where there should be one: nvidia-smi -L lists what the driver sees; a container needs its GPUs passed in.'),
      detail: ''
    });
  }
  if (status?.host_pids) {
    found.push({ key: 'host-pids', ...hostPidsText(trans), detail: '' });
  }
  return found;
}

/** How old figures received `received` are at `now` (ms) where they are not current: the latest poll
 * failed, or the server said NVML stopped answering (`stale_seconds`); null while they are current. */
export function staleSeconds(
  received: IReceived<{ gpu_status: IGpuStatus }> | null,
  failing: boolean,
  now: number
): number | null {
  if (received === null) {
    return null;
  }
  const since = received.reply.gpu_status.stale_seconds;
  if (!failing && since === null) {
    return null;
  }
  return (since ?? 0) + Math.max(0, now - received.at) / 1000;
}
