/**
 * A notebook's memory on one card over the kept span, in plain SVG (no chart library: the bundle stays
 * small): the card's figure for the kernel's process as a filled step line (a figure holds until the next
 * sample), the framework's own figure dashed, each cell a shaded band with its execution count, the peak
 * marked. Colours are JupyterLab's theme variables (style/base.css), so it reads in the dark theme too.
 *
 * Its text equivalent (`historyText`) is the SVG's `aria-label` and `<title>`, and is shown under it.
 * The chart is a focusable slider over its points (WAI-ARIA's slider pattern): the arrow keys, Home and
 * End move along them, the pointer picks the nearest; the point's time, figure and cell are its
 * `aria-valuetext` and are shown in a live region under the chart.
 */
import type { TranslationBundle } from '@jupyterlab/translation';
import React, { useState } from 'react';

import { ICardLines, IPoint, peakPoint } from './history';
import { historyOwn, historyPoint, historyText } from './words';

const WIDTH = 240;
const HEIGHT = 56;
/** Room at the top for the cells' numbers. */
const TOP = 12;
/** Narrowest band (px of the chart's width) that gets its execution count written in. */
const LABELLED_BAND = 20;

/** The chart's text equivalent: the span, the peak with its cell, the latest figure. */
export function chartText(trans: TranslationBundle, lines: ICardLines): string {
  const main = lines.main;
  return historyText(trans, lines.end - lines.start, peakPoint(main), main[main.length - 1]);
}

export function MemoryChart(props: { trans: TranslationBundle; lines: ICardLines }): JSX.Element {
  const { trans, lines } = props;
  const [chosen, choose] = useState<number | null>(null); // the chosen point's time: it survives new samples
  const main = lines.main;
  const span = Math.max(lines.end - lines.start, 1e-9);
  const top = Math.max(peakPoint(main).bytes, ...lines.own.map(point => point.bytes), 1);
  const x = (time: number): number => ((time - lines.start) / span) * WIDTH;
  const y = (bytes: number): number => HEIGHT - ((HEIGHT - TOP) * bytes) / top;
  const peak = peakPoint(main);
  const index = chosen === null ? -1 : nearest(main, chosen);
  const point = index >= 0 ? main[index] : null;
  const text = chartText(trans, lines);

  const onKey = (event: React.KeyboardEvent): void => {
    const moves: Record<string, number> = { ArrowLeft: index - 1, ArrowRight: index + 1, Home: 0, End: main.length - 1 };
    if (!(event.key in moves)) {
      return;
    }
    event.preventDefault();
    const to = index < 0 && event.key.startsWith('Arrow') ? main.length - 1 : moves[event.key];
    choose(main[Math.min(main.length - 1, Math.max(0, to))].time);
  };
  const onPointer = (event: React.MouseEvent<SVGSVGElement>): void => {
    const box = event.currentTarget.getBoundingClientRect();
    const fraction = box.width > 0 ? (event.clientX - box.left) / box.width : 1;
    choose(lines.start + fraction * span);
  };
  return (
    <div className="tfgpu-history">
      <svg
        className="tfgpu-history-chart"
        viewBox={`0 0 ${WIDTH} ${HEIGHT}`}
        role="slider"
        aria-label={text}
        aria-valuemin={0}
        aria-valuemax={main.length - 1}
        aria-valuenow={index >= 0 ? index : main.length - 1}
        aria-valuetext={historyPoint(trans, point ?? main[main.length - 1])}
        tabIndex={0}
        onKeyDown={onKey}
        onMouseMove={onPointer}
        onMouseLeave={() => choose(null)}
        onBlur={() => choose(null)}
        onFocus={() => choose(chosen ?? main[main.length - 1].time)}
      >
        <title>{text}</title>
        {lines.cells.map(cell => {
          const left = Math.max(0, x(cell.start));
          const right = Math.min(WIDTH, x(cell.end ?? lines.end));
          if (right <= left) {
            return null;
          }
          const busy = point !== null && point.cell !== null && point.cell === cell.execution_count;
          return (
            <g key={cell.start} className={busy ? 'tfgpu-history-cell tfgpu-history-chosen-cell' : 'tfgpu-history-cell'}>
              <rect x={left} y={0} width={Math.max(right - left, 0.5)} height={HEIGHT} />
              {cell.execution_count !== null && right - left >= LABELLED_BAND && (
                <text x={(left + right) / 2} y={TOP - 2} textAnchor="middle">{`[${cell.execution_count}]`}</text>
              )}
            </g>
          );
        })}
        <path className="tfgpu-history-area" d={`${steps(main, x, y)} V ${HEIGHT} H ${x(main[0].time)} Z`} />
        <path className="tfgpu-history-line" d={steps(main, x, y)} />
        {lines.own.length > 0 && <path className="tfgpu-history-own" d={steps(lines.own, x, y)} />}
        <circle className="tfgpu-history-peak" cx={x(peak.time)} cy={y(peak.bytes)} r={2.5} />
        {point && <circle className="tfgpu-history-point" cx={x(point.time)} cy={y(point.bytes)} r={3} />}
      </svg>
      <div className="tfgpu-history-text">{text}</div>
      {lines.ownSource && <div className="tfgpu-history-legend">{historyOwn(trans, lines.ownSource)}</div>}
      <div className="tfgpu-history-readout" aria-live="polite">
        {point ? historyPoint(trans, point) : ''}
      </div>
    </div>
  );
}

/** A step line through `line`: each figure holds until the next sample, the last to the chart's end. */
function steps(line: IPoint[], x: (time: number) => number, y: (bytes: number) => number): string {
  const parts = [`M ${x(line[0].time)} ${y(line[0].bytes)}`];
  for (const point of line.slice(1)) {
    parts.push(`H ${x(point.time)} V ${y(point.bytes)}`);
  }
  parts.push(`H ${WIDTH}`);
  return parts.join(' ');
}

/** The index of the point of `line` nearest `time`. */
function nearest(line: IPoint[], time: number): number {
  let best = 0;
  line.forEach((point, i) => {
    if (Math.abs(point.time - time) < Math.abs(line[best].time - time)) {
      best = i;
    }
  });
  return best;
}
