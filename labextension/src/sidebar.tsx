/**
 * The GPU sidebar: what cannot be shown and why (with the fix), this notebook's kernel and the other
 * frameworks in it (JAX, PyTorch, Keras's backend: none for a TensorFlow-only kernel), then a card per
 * GPU with its processes, "Shut down" for this user's idle kernels, a chart of each notebook's memory
 * on the card over time (`chart.tsx`), and the other frameworks' own figures of this notebook placed on
 * their card. A view of the model
 * (`VDomRenderer`): React reconciles every poll into the same nodes, keyed by card UUID and pid, so a
 * focused button keeps its focus and a click lands. Notebook names come from users and are rendered
 * as text only.
 */
import type { TranslationBundle } from '@jupyterlab/translation';
import { LabIcon, VDomRenderer } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import React from 'react';

import { StaleMark } from './age';
import type { IGpu, IGpuProcess, IKernelReply, IKernelRef } from './api';
import { MemoryChart } from './chart';
import { ICardLines, IKernelHistory, cardLines } from './history';
import type { GpuModel } from './model';
import { IProblem, problems } from './problems';
import { bytesText, gibPair } from './sizes';
import {
  FRAMEWORK_LABELS,
  frameworkMemory,
  frameworkMemoryLine,
  frameworkRows,
  idle,
  statusDetails,
  statusLine,
  tensorflowState
} from './words';

/** One device's own figures of a framework (`frameworkMemory`). */
type FrameworkFigure = ReturnType<typeof frameworkMemory>[number];

export const SIDEBAR_ID = 'tfgpu-sidebar';

const gpuIcon = new LabIcon({
  name: 'tfgpu-magic:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 7h18v10H3zM5 9v6h14V9zM7 10h4v4H7zm6 0h4v4h-4zM2 8h1v1H2zm0 3h1v1H2zm0 3h1v1H2zM6 17h1v2H6zm3 0h1v2H9z' +
    'm3 0h1v2h-1zm3 0h1v2h-1z"/></g></svg>'
});

/** Shuts an idle kernel of this server down, after asking (index.ts). */
export type Shutdown = (kernel: IKernelRef) => Promise<void>;

/** A kernel as a row names it: its notebook, else `kernel 1a2b3c4d`. */
export function kernelName(trans: TranslationBundle, kernel: IKernelRef): string {
  return kernel.notebook ?? trans.__('kernel %1', kernel.kernel_id.slice(0, 8));
}

export class GpuSidebar extends VDomRenderer<GpuModel> {
  /** `shown` runs each time the sidebar opens (the caller asks the server then, not a poll later). */
  constructor(
    model: GpuModel,
    private readonly trans: TranslationBundle,
    private readonly kernelId: () => string | null,
    private readonly shutdown: Shutdown,
    private readonly shown: () => void
  ) {
    super(model);
    this.id = SIDEBAR_ID;
    this.addClass('tfgpu-sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = trans.__('GPUs: which notebook holds which memory (tfgpu)');
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.shown();
  }

  protected render(): JSX.Element {
    const trans = this.trans;
    const model = this.model;
    const kernelId = this.kernelId();
    const kernel = model.kernel(kernelId);
    const gpus = model.gpus;
    const failing = model.failure !== null;
    const figures = frameworkMemory(kernel?.reply.frameworks ?? null);
    const cards = new Set((gpus?.reply.gpus ?? []).map(gpu => gpu.uuid));
    return (
      <>
        <h2 className="tfgpu-sidebar-title">{trans.__('GPUs')}</h2>
        <Problems trans={trans} problems={problems(trans, model, kernelId, true)} />
        {kernel && (
          <div className="tfgpu-kernel" title={statusDetails(trans, kernel.reply).join('\n')}>
            {trans.__('This notebook: %1', statusLine(trans, kernel.reply))}
            <StaleMark trans={trans} received={kernel} failing={failing} prefix=" · " />
          </div>
        )}
        {kernel && (
          <Frameworks
            trans={trans}
            reply={kernel.reply}
            unplaced={figures.filter(figure => figure.row.card === null || !cards.has(figure.row.card))}
          />
        )}
        {gpus && gpus.reply.gpus.length > 0 && (
          <div className="tfgpu-cards">
            <StaleMark trans={trans} received={gpus} failing={failing} />
            {gpus.reply.gpus.map(gpu => (
              <Card
                key={gpu.uuid}
                trans={trans}
                gpu={gpu}
                kernelId={kernelId}
                shutdown={this.shutdown}
                history={id => model.history(id)}
                figures={figures.filter(figure => figure.row.card === gpu.uuid)}
              />
            ))}
          </div>
        )}
      </>
    );
  }
}

/** Each problem: what, the fix; the server's own words as a tooltip. */
function Problems(props: { trans: TranslationBundle; problems: IProblem[] }): JSX.Element | null {
  if (!props.problems.length) {
    return null;
  }
  return (
    <div className="tfgpu-problems" role="status">
      {props.problems.map(problem => (
        <div key={problem.key} className={`tfgpu-problem tfgpu-problem-${problem.key}`} title={problem.detail || undefined}>
          <div className="tfgpu-problem-what">{problem.what}</div>
          {problem.fix && <div className="tfgpu-problem-fix">{problem.fix}</div>}
        </div>
      ))}
    </div>
  );
}

/** A line per other framework in this notebook's kernel: its version, state and what it was told; under
 * it, its figures of devices not on a card shown here. Nothing for a TensorFlow-only kernel. */
function Frameworks(props: { trans: TranslationBundle; reply: IKernelReply; unplaced: FrameworkFigure[] }): JSX.Element | null {
  const { trans, reply } = props;
  const rows = frameworkRows(trans, reply.frameworks, reply.policy?.growth === true);
  if (!rows.length) {
    return null;
  }
  return (
    <div className="tfgpu-frameworks">
      {rows.map(row => {
        const figures = props.unplaced.filter(figure => figure.name === row.name);
        return (
          <div key={row.name} className={`tfgpu-framework tfgpu-framework-${row.name}`}>
            <span className="tfgpu-framework-label">{row.label}</span> <span className="tfgpu-framework-line">{row.line}</span>
            {figures.length > 0 && (
              <ul className="tfgpu-framework-memory">
                {figures.map(({ name, row: figure }) => (
                  <li key={figure.device}>{frameworkMemoryLine(trans, name, figure, true)}</li>
                ))}
              </ul>
            )}
          </div>
        );
      })}
    </div>
  );
}

function Card(props: {
  trans: TranslationBundle;
  gpu: IGpu;
  kernelId: string | null;
  shutdown: Shutdown;
  history: (kernelId: string) => IKernelHistory | null;
  figures: FrameworkFigure[];
}): JSX.Element {
  const { trans, gpu, kernelId } = props;
  const total = gpu.memory_total ?? 0;
  const used = gpu.memory_used ?? 0;
  const own = gpu.processes.find(proc => isThis(proc, kernelId))?.gpu_memory ?? 0;
  const usedText = gibPair(gpu.memory_used, gpu.memory_total);
  const figures = [
    usedText,
    gpu.utilization === null ? trans.__('utilization ?') : trans.__('%1% busy', gpu.utilization)
  ];
  if (gpu.mig.length) {
    figures.push(trans.__('MIG ×%1', gpu.mig.length));
  }
  const name = (gpu.name ?? gpu.uuid).replace(/^NVIDIA /, '');
  const percent = (bytes: number): string => (total > 0 ? `${(100 * bytes) / total}%` : '0%');
  return (
    <div className={gpu.granted ? 'tfgpu-gpu-card' : 'tfgpu-gpu-card tfgpu-not-granted'} data-index={gpu.index}>
      <div className="tfgpu-gpu-title">{trans.__('GPU %1 · %2', gpu.index, name)}</div>
      {!gpu.granted && (
        <div className="tfgpu-grant">
          {trans.__("Outside this server's CUDA_VISIBLE_DEVICES: not for this server's kernels.")}
        </div>
      )}
      <div
        className="tfgpu-bar"
        role="img"
        aria-label={trans.__('%1 used, %2 of it by this notebook', usedText, bytesText(own))}
      >
        <div className="tfgpu-bar-used" style={{ width: percent(Math.max(0, used - own)) }} />
        <div className="tfgpu-bar-this" style={{ width: percent(own) }} />
      </div>
      <div className="tfgpu-gpu-figures">{figures.join(' · ')}</div>
      <ul className="tfgpu-processes">
        {gpu.processes.length === 0 && <li className="tfgpu-process tfgpu-none">{trans.__('no process')}</li>}
        {gpu.processes.map(proc => (
          <Process
            key={`${proc.memory_source}-${proc.pid}`}
            trans={trans}
            proc={proc}
            kernelId={kernelId}
            shutdown={props.shutdown}
            lines={proc.kernel ? cardLines(props.history(proc.kernel.kernel_id), gpu.index) : null}
          />
        ))}
      </ul>
      {props.figures.length > 0 && (
        <ul className="tfgpu-framework-figures">
          {props.figures.map(({ name, row }) => (
            <li
              key={`${name}-${row.device}`}
              className="tfgpu-framework-figure"
              title={trans.__("%1's own figures of this notebook's kernel (not what the card sees)", FRAMEWORK_LABELS[name])}
            >
              {trans.__('%1 ← this notebook', frameworkMemoryLine(trans, name, row, false))}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}

function isThis(proc: IGpuProcess, kernelId: string | null): boolean {
  return proc.kernel !== null && proc.kernel.kernel_id === kernelId;
}

/** `gpu.ipynb · 2.0 GiB · idle 5m · TF initialized`, `pid 4242 · alice · 19.0 GiB`; a TensorFlow
 * figure says so (it counts tensors, not the pool the card sees). */
function Process(props: {
  trans: TranslationBundle;
  proc: IGpuProcess;
  kernelId: string | null;
  shutdown: Shutdown;
  lines: ICardLines | null;
}): JSX.Element {
  const { trans, proc } = props;
  const kernel = proc.kernel;
  const here = isThis(proc, props.kernelId);
  const memory =
    proc.memory_source === 'tensorflow'
      ? trans.__("%1 (TensorFlow's figure)", bytesText(proc.gpu_memory))
      : bytesText(proc.gpu_memory);
  const parts = kernel
    ? [
        kernelName(trans, kernel),
        memory,
        kernel.execution_state === 'busy' ? trans.__('busy') : idle(trans, kernel.idle_seconds),
        kernel.tensorflow ? trans.__('TF %1', tensorflowState(trans, kernel.tensorflow)) : ''
      ]
    : [trans.__('pid %1', proc.pid), proc.user ?? '?', memory];
  const text = parts.filter(part => part).join(' · ');
  const title = proc.user ? trans.__('pid %1 · %2', proc.pid, proc.user) : trans.__('pid %1', proc.pid);
  return (
    <li className={here ? 'tfgpu-process tfgpu-this' : 'tfgpu-process'} title={title}>
      <span className="tfgpu-process-text">{here ? trans.__('%1 ← this notebook', text) : text}</span>
      {kernel && kernel.execution_state === 'idle' && !here && (
        <button
          type="button"
          className="jp-Button tfgpu-shutdown"
          aria-label={trans.__('Shut down the kernel of %1', kernelName(trans, kernel))}
          title={trans.__('Shut down this idle kernel (after a confirmation): its variables are lost, its GPU memory freed')}
          onClick={() => void props.shutdown(kernel)}
        >
          {trans.__('Shut down')}
        </button>
      )}
      {props.lines && <MemoryChart trans={trans} lines={props.lines} />}
    </li>
  );
}
