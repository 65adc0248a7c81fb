/**
 * What the views cannot show, and why: the model's failure, the replies' error codes, no GPU, a server
 * in a container of its own; and how old shown figures are when they are not current.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

import type { IGpuStatus } from './api';
import type { GpuModel, IFailure, IReceived } from './model';
import { IProblemText, errorText, failureText, hostPidsText } from './words';

/** One problem as the views show it: what, the fix, and the server's own words (a tooltip). */
export interface IProblem extends IProblemText {
  key: string;
  detail: string;
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
    found.push({ key: `failure-${failure.kind}`, ...failureText(trans, failure.kind, failure.status), detail: failure.detail });
  }
  const kernel = model.kernel(kernelId)?.reply ?? null;
  if (kernel?.error) {
    found.push({ key: `kernel-${kernel.error.code}`, ...errorText(trans, kernel.error.code), detail: kernel.error.message });
  }
  const cards = gpus ? (model.gpus?.reply ?? null) : null;
  const status = cards?.gpu_status ?? kernel?.gpu_status ?? null;
  if (status?.error) {
    found.push({ key: `gpu-${status.error.code}`, ...errorText(trans, status.error.code), detail: status.error.message });
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

/** A short word for the status bar where there is nothing else to show. */
export function failureShort(trans: TranslationBundle, failure: IFailure): string {
  switch (failure.kind) {
    case 'extension-missing':
      return trans.__('GPU: server extension off');
    case 'server-gone':
      return trans.__('GPU: server not answering');
    case 'failed':
      return trans.__('GPU: request failed (HTTP %1)', failure.status ?? '?');
  }
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
