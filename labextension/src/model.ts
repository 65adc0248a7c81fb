/**
 * What the server extension last said, and what went wrong since: one model, one `Poll`
 * (`@lumino/polling`, as jupyter-resource-usage's model.ts), shared by the status item and the sidebar.
 *
 * It asks only what something shown needs (`demand`): the active notebook's kernel while the status
 * item or the sidebar shows it, the cards while the sidebar is open; nothing while the page is hidden
 * (`standby`), nothing with no notebook and the sidebar closed, nothing while the page has lost its server
 * (`connected`). It keeps the last good reply of each endpoint with the time it came, so views can show
 * old figures marked stale, and the current failure.
 * While failing it probes with one request at a time, backing off (Poll's backoff), and never sends
 * more than `FAILING_BUDGET` requests in `FAILING_WINDOW_MS`: a server without the extension, or a
 * server gone, is not hammered by every open tab.
 *
 * Memory over time (`history.ts`): while the sidebar shows the cards it also asks about each kernel of
 * this server on them (its chart), each time with `since`, the last answer's `next_since`, so a poll
 * carries only new samples, appended to a buffer per kernel bounded by the server's span. A kernel
 * the server no longer knows (ended) loses its buffer; a restarted one (another pid) starts a fresh one.
 */
import { VDomModel } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';

import {
  ErrorCode,
  FailureKind,
  IGpusReply,
  IKernelReply,
  RequestFailure,
  getGpus,
  getKernel
} from './api';
import { IKernelHistory, appendHistory } from './history';

/** What the views need now: a kernel's status (its id), the cards. */
export interface IDemand {
  kernelId: string | null;
  gpus: boolean;
}

/** A good reply and when it came (`Date.now()`). */
export interface IReceived<T> {
  reply: T;
  at: number;
}

/** The latest request failed: how, since when (`Date.now()` of the first failure of this kind), and the
 * code of the server's error body where it sent one (the views word it). */
export interface IFailure {
  kind: Exclude<FailureKind, 'unknown-kernel'>;
  status: number | null;
  code: ErrorCode | null;
  detail: string;
  since: number;
}

/** The refresh rate's default and least value (the settings schema, schema/plugin.json, says the same). */
export const DEFAULT_REFRESH_MS = 3000;
const MIN_REFRESH_MS = 1000;
/** At most this many requests in any `FAILING_WINDOW_MS` while failing (6 a minute, so that a failing server is not hammered);
 * the window is a second longer than a minute, so that no minute measured anyhow holds more. */
const FAILING_BUDGET = 6;
const FAILING_WINDOW_MS = 61_000;
/** The longest wait between two probes while failing (Poll's backoff grows up to it). */
const MAX_BACKOFF_MS = 60_000;
/** Kernels whose last reply is kept (the notebooks a user switches between). */
const KEPT_KERNELS = 16;

export class GpuModel extends VDomModel {
  constructor(options: IGpuModelOptions) {
    super();
    this._demand = options.demand;
    this._connected = options.connected ?? ((): boolean => true);
    this._poll = new Poll<void, RequestFailure, 'standby'>({
      factory: (): Promise<void> => this._tick(),
      frequency: { interval: clampRefresh(options.refreshRate), backoff: true, max: MAX_BACKOFF_MS },
      linger: 0,
      name: 'tfgpu-magic:GpuModel',
      standby: (): boolean | Poll.Standby => (this._nothingShown() || !this._connected() ? true : 'when-hidden')
    });
  }

  /** The last good `GET /api/tfgpu/gpus`, or null. */
  get gpus(): IReceived<IGpusReply> | null {
    return this._gpus;
  }

  /** The last good reply about `kernelId`, or null. */
  kernel(kernelId: string | null): IReceived<IKernelReply> | null {
    return kernelId === null ? null : (this._kernels.get(kernelId) ?? null);
  }

  /** What the browser holds of `kernelId`'s memory over time, or null. */
  history(kernelId: string | null): IKernelHistory | null {
    return kernelId === null ? null : (this._histories.get(kernelId) ?? null);
  }

  /** Whether the server extension said it does not know `kernelId` (a kernel that just started). */
  unknownKernel(kernelId: string | null): boolean {
    return kernelId !== null && this._unknown.has(kernelId);
  }

  /** Why the latest request gave no reply; null once one succeeds. */
  get failure(): IFailure | null {
    return this._failure;
  }

  /** Milliseconds between two polls while things work. */
  set refreshRate(ms: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: clampRefresh(ms) };
  }

  /** Ask now (the sidebar opened, another notebook or kernel); resolves after the answer. */
  async refresh(): Promise<void> {
    await this._poll.refresh();
    await this._poll.tick.catch(() => undefined);
  }

  /**
   * The reply about `kernelId` for a decision now (the restart command): asked afresh, within the
   * failing budget; the last good one where the answer takes longer than `waitMs` or fails.
   */
  async freshKernel(kernelId: string, waitMs: number): Promise<IKernelReply | null> {
    const kept = this.kernel(kernelId)?.reply ?? null;
    if (this._failure !== null && !this._budgetLeft()) {
      return kept;
    }
    const asked = this._ask({ kernelId, gpus: false }).then(
      () => this.kernel(kernelId)?.reply ?? null,
      () => kept
    );
    const late = new Promise<IKernelReply | null>(resolve => window.setTimeout(() => resolve(kept), waitMs));
    return Promise.race([asked, late]);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  private _nothingShown(): boolean {
    const demand = this._demand();
    return demand.kernelId === null && !demand.gpus;
  }

  /** One poll: what is shown, or a single probe while failing (none once the budget is spent). */
  private async _tick(): Promise<void> {
    const demand = this._demand(); // something is shown: else `standby` kept the poll from calling this
    if (this._failure !== null) {
      if (!this._budgetLeft()) {
        throw new RequestFailure(this._failure.kind, this._failure.status, this._failure.detail, this._failure.code);
      }
      // one request while failing: the cards where shown (never a 404 of a kernel just started)
      return this._ask(demand.gpus ? { kernelId: null, gpus: true } : demand, true);
    }
    return this._ask(demand);
  }

  /** The kernels of this server on the cards last seen (their charts), at most `KEPT_KERNELS`. */
  private _cardKernels(): string[] {
    const ids = (this._gpus?.reply.gpus ?? []).flatMap(gpu => gpu.processes.map(proc => proc.kernel?.kernel_id ?? null));
    return [...new Set(ids.filter((id): id is string => id !== null))];
  }

  /** Send the requests `demand` names (with the cards, their kernels too, unless this is a `probe` while
   * failing: one request), keep what comes; throw the first failure, after recording it. */
  private async _ask(demand: IDemand, probe = false): Promise<void> {
    const kernelId = demand.kernelId;
    // the notebook's own kernel first, and room for it among the kept replies
    const others = demand.gpus && !probe ? this._cardKernels().filter(id => id !== kernelId) : [];
    const kernels = [...(kernelId !== null ? [kernelId] : []), ...others.slice(0, KEPT_KERNELS - 1)];
    const unknown: string[] = [];
    const asks: Promise<void>[] = kernels.map(id =>
      getKernel(id, this.history(id)?.nextSince ?? null).then(
        reply => this._keepKernel(id, { reply, at: Date.now() }),
        (reason: unknown) => {
          const gone = reason instanceof RequestFailure && reason.kind === 'unknown-kernel';
          if (id !== kernelId) {
            // another kernel's chart: one that ended is forgotten, and no failure of it fails the views
            if (gone) {
              this._kernels.delete(id);
              this._histories.delete(id);
            }
            return;
          }
          if (gone) {
            unknown.push(id);
          }
          throw reason;
        }
      )
    );
    if (demand.gpus) {
      asks.push(
        getGpus().then(reply => {
          this._gpus = { reply, at: Date.now() };
        })
      );
    }
    this._sends.push(...asks.map(() => Date.now()));
    const outcomes = await Promise.allSettled(asks);
    for (const id of unknown) {
      this._unknown.add(id);
      this._histories.delete(id); // the kernel ended (or not started yet): nothing of it to draw
    }
    let failed: RequestFailure | null = null;
    for (const outcome of outcomes) {
      if (outcome.status === 'fulfilled') {
        continue;
      }
      const reason = outcome.reason;
      const failure = reason instanceof RequestFailure ? reason : new RequestFailure('failed', null, String(reason));
      if (failure.kind === 'unknown-kernel') {
        continue;
      }
      failed = failed ?? failure;
    }
    if (failed === null) {
      this._failure = null;
      this._sends = [];
      this.stateChanged.emit();
      return;
    }
    const kind = failed.kind as IFailure['kind'];
    const since = this._failure?.kind === kind ? this._failure.since : Date.now();
    this._failure = { kind, status: failed.status, code: failed.code, detail: failed.message, since };
    this.stateChanged.emit();
    throw failed;
  }

  /** Whether one more request fits the failing budget. */
  private _budgetLeft(): boolean {
    const horizon = Date.now() - FAILING_WINDOW_MS;
    this._sends = this._sends.filter(at => at > horizon);
    return this._sends.length < FAILING_BUDGET;
  }

  private _keepKernel(kernelId: string, received: IReceived<IKernelReply>): void {
    this._unknown.delete(kernelId);
    this._kernels.delete(kernelId); // re-inserted last: the map's order is the order of use
    this._kernels.set(kernelId, received);
    const history = appendHistory(this.history(kernelId), received.reply);
    if (history === null) {
      this._histories.delete(kernelId);
    } else {
      this._histories.set(kernelId, history);
    }
    for (const old of this._kernels.keys()) {
      if (this._kernels.size <= KEPT_KERNELS) {
        break;
      }
      this._kernels.delete(old);
      this._histories.delete(old);
    }
  }

  private readonly _demand: () => IDemand;
  private readonly _connected: () => boolean;
  private readonly _poll: Poll<void, RequestFailure, 'standby'>;
  private _gpus: IReceived<IGpusReply> | null = null;
  private readonly _kernels = new Map<string, IReceived<IKernelReply>>();
  private readonly _histories = new Map<string, IKernelHistory>();
  private readonly _unknown = new Set<string>();
  private _failure: IFailure | null = null;
  /** When each request since the last fully answered one was sent: while failing, the budget's count. */
  private _sends: number[] = [];
}

/** A refresh rate from settings, kept within what the schema allows. */
function clampRefresh(ms: number): number {
  return Number.isFinite(ms) ? Math.max(MIN_REFRESH_MS, Math.round(ms)) : DEFAULT_REFRESH_MS;
}

/** Options of a `GpuModel`. */
export interface IGpuModelOptions {
  /** Milliseconds between two polls while things work (settings: `refreshRate`). */
  refreshRate: number;
  /** What the views show now; asked at every tick. */
  demand: () => IDemand;
  /** Whether the page is connected to its server (JupyterLab's `IInfo.isConnected`, false while the
   * "server connection lost" dialog is up): the poll stands by while it is false, as JupyterLab's own
   * service manager does. Always connected where it is not given. */
  connected?: () => boolean;
}
