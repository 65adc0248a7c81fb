/**
 * history.ts: the browser's buffer of a kernel's memory over time. Answers arrive in pieces (only what is
 * new after `since`); they are appended, merged by time and by cell start, trimmed to the server's span
 * (and to a cap), and started afresh when the kernel restarts (another pid).
 */
import type { ICellRun, IKernelReply, IMemoryHistory, IMemorySeries } from '../api';
import { appendHistory, cardLines, peakPoint } from '../history';
import { chartText } from '../chart';
import { trans } from './trans';

const GIB = 1024 ** 3;

/** A kernel reply carrying `history` (only the fields history.ts reads are meaningful). */
function reply(pid: number | null, history?: Partial<IMemoryHistory>): IKernelReply {
  const part: IMemoryHistory | undefined = history && {
    interval_seconds: 2,
    span_seconds: 600,
    since: null,
    next_since: null,
    oldest: null,
    times: [],
    running: [],
    series: [],
    cells: [],
    ...history
  };
  return { pid, history: part } as IKernelReply;
}

function nvml(values: (number | null)[], gpu = 0): IMemorySeries {
  return { gpu, source: 'nvml', figure: 'used', values };
}

describe('appendHistory', () => {
  it('is null for a reply without history (an older server extension)', () => {
    expect(appendHistory(null, reply(7))).toBeNull();
  });

  it('appends what is new and keeps the next since', () => {
    let kept = appendHistory(null, reply(7, { times: [10, 12], running: [1, 1], series: [nvml([1, 2])], next_since: 12 }));
    kept = appendHistory(kept, reply(7, { times: [14], running: [null], series: [nvml([3])], next_since: 14 }));
    expect(kept?.times).toEqual([10, 12, 14]);
    expect(kept?.running).toEqual([1, 1, null]);
    expect(kept?.series.get('0/nvml/used')?.values).toEqual([1, 2, 3]);
    expect(kept?.nextSince).toBe(14);
  });

  it('counts two answers to the same since once', () => {
    const first = reply(7, { times: [10, 12], running: [1, 1], series: [nvml([1, 2])], next_since: 12 });
    let kept = appendHistory(null, first);
    kept = appendHistory(kept, reply(7, { times: [12, 14], running: [1, 2], series: [nvml([2, 4])], next_since: 14 }));
    expect(kept?.times).toEqual([10, 12, 14]);
    expect(kept?.series.get('0/nvml/used')?.values).toEqual([1, 2, 4]);
  });

  it('aligns a series that starts late, and one missing from an answer, with null', () => {
    let kept = appendHistory(null, reply(7, { times: [10], running: [null], series: [nvml([1])] }));
    const tf: IMemorySeries = { gpu: 0, source: 'tensorflow', figure: 'current', values: [5] };
    kept = appendHistory(kept, reply(7, { times: [12], running: [null], series: [tf] }));
    expect(kept?.series.get('0/tensorflow/current')?.values).toEqual([null, 5]);
    expect(kept?.series.get('0/nvml/used')?.values).toEqual([1, null]);
  });

  it('merges cells by start: a running cell seen again with its end replaces it', () => {
    const running: ICellRun = { execution_count: 3, start: 11, end: null };
    let kept = appendHistory(null, reply(7, { times: [10, 12], running: [null, 3], cells: [running] }));
    kept = appendHistory(kept, reply(7, { times: [14], running: [null], cells: [{ ...running, end: 13 }, { execution_count: 4, start: 9, end: 10 }] }));
    expect(kept?.cells).toEqual([
      { execution_count: 4, start: 9, end: 10 },
      { execution_count: 3, start: 11, end: 13 }
    ]);
  });

  it('drops samples and ended cells older than the span before the newest sample', () => {
    const times = [0, 50, 100, 150];
    const cells: ICellRun[] = [
      { execution_count: 1, start: 0, end: 10 },
      { execution_count: 2, start: 20, end: null },
      { execution_count: 3, start: 90, end: 120 }
    ];
    const kept = appendHistory(null, reply(7, { span_seconds: 100, times, running: [1, 2, 3, null], series: [nvml([0, 1, 2, 3])], cells }));
    expect(kept?.times).toEqual([50, 100, 150]);
    expect(kept?.running).toEqual([2, 3, null]);
    expect(kept?.series.get('0/nvml/used')?.values).toEqual([1, 2, 3]);
    expect(kept?.cells.map(cell => cell.execution_count)).toEqual([2, 3]);
  });

  it('keeps at most 43,200 samples whatever the span', () => {
    const times = Array.from({ length: 43_210 }, (_, i) => i);
    const kept = appendHistory(null, reply(7, { span_seconds: 10 ** 9, times, running: times.map(() => null) }));
    expect(kept?.times.length).toBe(43_200);
    expect(kept?.times[0]).toBe(10);
  });

  it('starts afresh when the kernel restarted (another pid)', () => {
    const before = appendHistory(null, reply(7, { times: [10, 12], running: [1, 1], series: [nvml([1, 2])], next_since: 12 }));
    const after = appendHistory(before, reply(8, { times: [3], running: [null], series: [nvml([9])], next_since: 3 }));
    expect(after?.pid).toBe(8);
    expect(after?.times).toEqual([3]);
    expect(after?.series.get('0/nvml/used')?.values).toEqual([9]);
    expect(after?.nextSince).toBe(3);
  });
});

describe('cardLines and the chart text', () => {
  const series: IMemorySeries[] = [
    nvml([1 * GIB, 5.9 * GIB, 2.9 * GIB]),
    { gpu: 0, source: 'tensorflow', figure: 'current', values: [0.5 * GIB, 4 * GIB, 2 * GIB] },
    { gpu: 1, source: 'jax', figure: 'current', values: [null, 1 * GIB, 1 * GIB] }
  ];
  const kept = appendHistory(null, reply(7, { span_seconds: 3600, times: [100, 460, 820], running: [null, 3, null], series }));

  it('draws the card figure as the main line and the framework own figure beside it', () => {
    const lines = cardLines(kept, 0);
    expect(lines?.mainSource).toBe('nvml');
    expect(lines?.ownSource).toBe('tensorflow');
    expect(lines?.main.map(point => point.bytes)).toEqual([1 * GIB, 5.9 * GIB, 2.9 * GIB]);
    expect(lines?.start).toBe(100);
    expect(lines?.end).toBe(820);
  });

  it("falls back to the framework's figure where the card has none, skipping missing points", () => {
    const lines = cardLines(kept, 1);
    expect(lines?.mainSource).toBe('jax');
    expect(lines?.ownSource).toBeNull();
    expect(lines?.main.map(point => point.time)).toEqual([460, 820]);
    expect(cardLines(kept, 2)).toBeNull();
    expect(cardLines(null, 0)).toBeNull();
  });

  it('says the span, the peak with its cell and the latest figure', () => {
    const lines = cardLines(kept, 0);
    expect(lines && peakPoint(lines.main)).toEqual({ time: 460, bytes: 5.9 * GIB, cell: 3 });
    expect(lines && chartText(trans, lines)).toBe('last 12 min: peak 5.9 GiB during cell [3]; now 2.9 GiB');
  });
});
