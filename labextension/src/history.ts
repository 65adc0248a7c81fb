/**
 * Each kernel's GPU memory over time as the browser keeps it: the server's history
 * (`IKernelReply.history`, tfgpu_magic/serverext) arrives in pieces, only what is new after the last
 * answer's `next_since`, and is appended here to a buffer bounded by the server's own span. A kernel
 * restarted (another pid) starts a fresh buffer; the model drops the buffer of a kernel that ended.
 * Pure data: the chart (`chart.tsx`) draws `cardLines`, `words.ts` words `historyText`.
 */
import type { ICellRun, IKernelReply, IMemorySeries, MemoryFigure, MemorySource } from './api';

/** One line of a kernel's memory on one card, its `values` aligned with `IKernelHistory.times`. */
export type IKeptSeries = IMemorySeries;

/** What the browser holds of one kernel's history. */
export interface IKernelHistory {
  /** The kernel's process: another pid is a restarted kernel, whose history starts afresh. */
  pid: number | null;
  spanSeconds: number;
  intervalSeconds: number;
  /** What the next request passes as `since` (the last answer's `next_since`). */
  nextSince: number | null;
  times: number[];
  running: (number | null)[];
  series: Map<string, IKeptSeries>;
  /** Cells by start, oldest first. */
  cells: ICellRun[];
}

/** At most this many samples per kernel, whatever the server's span says (a day at 2 s). */
const MAX_SAMPLES = 43_200;

function seriesKey(gpu: number, source: MemorySource, figure: MemoryFigure): string {
  return `${gpu}/${source}/${figure}`;
}

/** `kept` with the new part of `reply`'s history appended (a fresh buffer after a restart), what is older
 * than the span dropped; null where the reply has no history (an older server extension). */
export function appendHistory(kept: IKernelHistory | null, reply: IKernelReply): IKernelHistory | null {
  const part = reply.history;
  if (!part) {
    return null;
  }
  const buffer: IKernelHistory =
    kept !== null && kept.pid === reply.pid
      ? kept
      : { pid: reply.pid, spanSeconds: 0, intervalSeconds: 0, nextSince: null, times: [], running: [], series: new Map(), cells: [] };
  buffer.spanSeconds = part.span_seconds;
  buffer.intervalSeconds = part.interval_seconds;
  buffer.nextSince = part.next_since ?? buffer.nextSince;
  // two answers to the same `since` (a poll and the restart command's fresh ask): only later samples count
  const last = buffer.times.length ? buffer.times[buffer.times.length - 1] : -Infinity;
  const fresh = part.times.flatMap((time, i) => (time > last ? [i] : []));
  const before = buffer.times.length;
  buffer.times.push(...fresh.map(i => part.times[i]));
  buffer.running.push(...fresh.map(i => part.running[i] ?? null));
  for (const series of part.series) {
    const key = seriesKey(series.gpu, series.source, series.figure);
    const line = buffer.series.get(key) ?? { ...series, values: new Array<number | null>(before).fill(null) };
    line.values.push(...fresh.map(i => series.values[i] ?? null));
    buffer.series.set(key, line);
  }
  for (const line of buffer.series.values()) {
    while (line.values.length < buffer.times.length) {
      line.values.push(null); // not in this answer: no figure for these samples
    }
  }
  for (const cell of part.cells) {
    const same = buffer.cells.findIndex(known => known.start === cell.start);
    buffer.cells.splice(same >= 0 ? same : buffer.cells.length, same >= 0 ? 1 : 0, cell);
  }
  buffer.cells.sort((a, b) => a.start - b.start);
  trim(buffer);
  return buffer;
}

/** Drop the samples (and ended cells) older than the span before the newest sample. */
function trim(buffer: IKernelHistory): void {
  const times = buffer.times;
  if (!times.length) {
    return;
  }
  const horizon = times[times.length - 1] - buffer.spanSeconds;
  let drop = 0;
  while (drop < times.length && (times[drop] < horizon || times.length - drop > MAX_SAMPLES)) {
    drop++;
  }
  if (drop) {
    times.splice(0, drop);
    buffer.running.splice(0, drop);
    for (const line of buffer.series.values()) {
      line.values.splice(0, drop);
    }
  }
  const first = times.length ? times[0] : horizon;
  buffer.cells = buffer.cells.filter(cell => cell.end === null || cell.end >= first);
}

/** A point of a line: when (Unix seconds), how many bytes, the cell running then. */
export interface IPoint {
  time: number;
  bytes: number;
  cell: number | null;
}

/** A framework that publishes its own figures. */
export type FrameworkSource = Exclude<MemorySource, 'nvml'>;

/** What a card's chart draws: the main line (the card's figure for the kernel's process, NVML; a
 * framework's own where the card cannot tell), the framework's own figure beside it, the cells. */
export interface ICardLines {
  main: IPoint[];
  mainSource: MemorySource;
  own: IPoint[];
  ownSource: FrameworkSource | null;
  cells: ICellRun[];
  start: number;
  end: number;
}

/** Which series stand for a framework's tensors (PyTorch: allocated), in the order a chart prefers. */
const OWN: [FrameworkSource, MemoryFigure][] = [
  ['tensorflow', 'current'],
  ['jax', 'current'],
  ['torch', 'current']
];

function points(buffer: IKernelHistory, line: IKeptSeries): IPoint[] {
  const found: IPoint[] = [];
  line.values.forEach((bytes, i) => {
    if (bytes !== null) {
      found.push({ time: buffer.times[i], bytes, cell: buffer.running[i] });
    }
  });
  return found;
}

/** The lines of card `gpu` (nvidia-smi index); null where the kernel has no figure there. */
export function cardLines(buffer: IKernelHistory | null, gpu: number): ICardLines | null {
  if (buffer === null || !buffer.times.length) {
    return null;
  }
  const line = (source: MemorySource, figure: MemoryFigure): IPoint[] => {
    const kept = buffer.series.get(seriesKey(gpu, source, figure));
    return kept ? points(buffer, kept) : [];
  };
  const own = OWN.map(([source, figure]) => ({ source, points: line(source, figure) })).find(found => found.points.length);
  const nvml = line('nvml', 'used');
  const main = nvml.length ? { source: 'nvml' as MemorySource, points: nvml } : own;
  if (!main) {
    return null;
  }
  const other = main === own ? undefined : own;
  return {
    main: main.points,
    mainSource: main.source,
    own: other?.points ?? [],
    ownSource: other?.source ?? null,
    cells: buffer.cells,
    start: buffer.times[0],
    end: buffer.times[buffer.times.length - 1]
  };
}

/** The highest point (the first of equal ones). */
export function peakPoint(line: IPoint[]): IPoint {
  return line.reduce((top, point) => (point.bytes > top.bytes ? point : top), line[0]);
}
