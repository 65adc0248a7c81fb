/**
 * model.ts: the poll's failure budget and its standby, with the network replaced (`getGpus`, `getKernel`
 * are jest mocks; `RequestFailure` and the rest of api.ts are the real ones) and time faked, so a test
 * can run minutes of polling in milliseconds. The real `Poll` (@lumino/polling) schedules the ticks.
 */
import type { IGpusReply, IKernelReply } from '../api';

jest.mock('@jupyterlab/ui-components', () => jest.requireActual('./vdommodel'));
jest.mock('../api', () => ({ ...jest.requireActual('../api'), getGpus: jest.fn(), getKernel: jest.fn() }));

import { RequestFailure, getGpus, getKernel } from '../api';
import { GpuModel, IDemand } from '../model';

const gpus = getGpus as jest.MockedFunction<typeof getGpus>;
const kernel = getKernel as jest.MockedFunction<typeof getKernel>;
const GPUS_REPLY = { gpus: [] } as unknown as IGpusReply;

/** When (fake `Date.now()`) each request was sent. */
let sent: number[] = [];
let model: GpuModel | null = null;

function serverGone(): Promise<never> {
  sent.push(Date.now());
  return Promise.reject(new RequestFailure('server-gone', null, 'TypeError: Failed to fetch'));
}

function answer<T>(reply: T): () => Promise<T> {
  return () => {
    sent.push(Date.now());
    return Promise.resolve(reply);
  };
}

function start(demand: IDemand, connected?: () => boolean): GpuModel {
  model = new GpuModel({ refreshRate: 1000, demand: (): IDemand => demand, connected });
  return model;
}

/** The most requests sent in any `window` ms. */
function busiest(window: number): number {
  return Math.max(0, ...sent.map(from => sent.filter(at => at >= from && at < from + window).length));
}

beforeEach(() => {
  jest.useFakeTimers();
  sent = [];
  gpus.mockReset();
  kernel.mockReset();
});

afterEach(() => {
  model?.dispose();
  model = null;
  jest.useRealTimers();
});

describe('the failure budget', () => {
  it('sends at most 6 requests a minute while the server is gone, however often it is asked', async () => {
    gpus.mockImplementation(serverGone);
    const failing = start({ kernelId: null, gpus: true });
    for (let second = 0; second < 300; second++) {
      void failing.refresh(); // the sidebar opened, another notebook: each asks now
      await jest.advanceTimersByTimeAsync(1000);
    }
    expect(failing.failure?.kind).toBe('server-gone');
    expect(busiest(61_000)).toBeLessThanOrEqual(6);
    expect(sent.length).toBeGreaterThanOrEqual(20); // it keeps probing: ~6 every 61 s over 5 minutes
  });

  it('probes with one request at a time while failing, and recovers on the first answer', async () => {
    gpus.mockImplementation(serverGone);
    kernel.mockImplementation(serverGone);
    const failing = start({ kernelId: 'k1', gpus: true });
    await jest.advanceTimersByTimeAsync(100); // the poll's first tick: the kernel and the cards, at once
    expect(kernel).toHaveBeenCalledTimes(1);
    expect(sent.slice(0, 2)).toEqual([sent[0], sent[0]]);
    await jest.advanceTimersByTimeAsync(10_000);
    // later ticks, while failing, probe with the cards alone: never the kernel, never two requests at once
    expect(kernel).toHaveBeenCalledTimes(1);
    expect(gpus.mock.calls.length).toBeGreaterThan(1);
    expect(new Set(sent.slice(2)).size).toBe(sent.length - 2);
    gpus.mockImplementation(answer(GPUS_REPLY));
    kernel.mockImplementation(answer({ pid: 7 } as IKernelReply));
    await jest.advanceTimersByTimeAsync(120_000);
    expect(failing.failure).toBeNull();
    expect(failing.gpus?.reply).toBe(GPUS_REPLY);
    expect(failing.kernel('k1')?.reply.pid).toBe(7);
  });

  it('counts a kernel the server does not know as no failure', async () => {
    gpus.mockImplementation(answer(GPUS_REPLY));
    kernel.mockImplementation(() => Promise.reject(new RequestFailure('unknown-kernel', 404, 'no such kernel')));
    const working = start({ kernelId: 'new', gpus: true });
    await jest.advanceTimersByTimeAsync(100); // the poll's first tick
    expect(working.failure).toBeNull();
    expect(working.unknownKernel('new')).toBe(true);
  });
});

describe('standby', () => {
  it('sends nothing while the page has lost its server, and polls again once it is back', async () => {
    gpus.mockImplementation(answer(GPUS_REPLY));
    let connected = false;
    start({ kernelId: null, gpus: true }, () => connected);
    await jest.advanceTimersByTimeAsync(30_000);
    expect(sent).toEqual([]);
    connected = true;
    await jest.advanceTimersByTimeAsync(2_000);
    expect(sent.length).toBeGreaterThanOrEqual(1);
  });

  it('sends nothing while nothing is shown', async () => {
    gpus.mockImplementation(answer(GPUS_REPLY));
    start({ kernelId: null, gpus: false });
    await jest.advanceTimersByTimeAsync(30_000);
    expect(sent).toEqual([]);
  });

  it('polls at the refresh rate while shown and connected', async () => {
    gpus.mockImplementation(answer(GPUS_REPLY));
    start({ kernelId: null, gpus: true }, () => true);
    await jest.advanceTimersByTimeAsync(10_000);
    expect(sent.length).toBeGreaterThanOrEqual(9);
    expect(sent.length).toBeLessThanOrEqual(12);
  });
});
