/**
 * The status bar item and the GPU sidebar. Both are plain Lumino widgets that render a reply into DOM
 * nodes with `textContent` only: notebook names and paths come from users and are shown as text.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import type { IGpu, IGpuProcess, IGpusReply, IKernelReply } from './api';
import { gibPair, idle, size, statusLine, statusTitle } from './format';

export const STATUS_ID = 'tfgpu-statusbar';
export const SIDEBAR_ID = 'tfgpu-sidebar';

export const gpuIcon = new LabIcon({
  name: 'tfgpu-magic:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 7h18v10H3zM5 9v6h14V9zM7 10h4v4H7zm6 0h4v4h-4zM2 8h1v1H2zm0 3h1v1H2zm0 3h1v1H2zM6 17h1v2H6zm3 0h1v2H9z' +
    'm3 0h1v2h-1zm3 0h1v2h-1z"/></g></svg>'
});

/** Append a new `tag` element with `className` and, if given, `text` as its text. */
function element<K extends keyof HTMLElementTagNameMap>(
  parent: HTMLElement,
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  parent.appendChild(node);
  return node;
}

/** The active notebook's kernel in one line; a click opens the sidebar. */
export class GpuStatus extends Widget {
  constructor(onClick: () => void) {
    super();
    this.id = STATUS_ID;
    this.addClass('tfgpu-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.addEventListener('click', onClick);
    this.render(null);
  }

  /** Show `reply`; hide the item when there is none (no notebook, no kernel yet). */
  render(reply: IKernelReply | null): void {
    this.node.textContent = reply ? statusLine(reply) : '';
    this.node.title = reply ? statusTitle(reply) : '';
    this.node.classList.toggle('tfgpu-pending', !!reply?.restart_needed);
    this.setHidden(reply === null);
  }
}

/** Shuts an idle kernel of this server down, after asking (index.ts). */
export type Shutdown = (process: IGpuProcess & { kernel_id: string }) => Promise<void>;

/** One card per GPU: memory bar, utilization, the processes on it with this user's notebooks.
 * `shown` runs each time the sidebar opens (the caller asks the server then, not a poll later). */
export class GpuSidebar extends Widget {
  constructor(
    private readonly shutdown: Shutdown,
    private readonly shown: () => void
  ) {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('tfgpu-sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPUs: which notebook holds which memory (tfgpu)';
    element(this.node, 'h2', 'tfgpu-sidebar-title', 'GPUs');
    this.kernelLine = element(this.node, 'div', 'tfgpu-kernel');
    this.message = element(this.node, 'div', 'tfgpu-message');
    this.cards = element(this.node, 'div', 'tfgpu-cards');
  }

  /** Render the cards of `gpus` (kept as they are when null), marking `kernel`'s process. */
  render(gpus: IGpusReply | null, kernel: IKernelReply | null, kernelId: string | null): void {
    this.kernelLine.textContent = kernel ? `This notebook: ${statusLine(kernel)}` : '';
    this.kernelLine.title = kernel ? statusTitle(kernel) : '';
    if (gpus === null) {
      return;
    }
    this.message.textContent = gpus.error ?? (gpus.gpus.length ? '' : 'NVML lists no GPU.');
    this.cards.replaceChildren();
    for (const gpu of gpus.gpus) {
      this.card(gpu, kernelId);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.shown();
  }

  private card(gpu: IGpu, kernelId: string | null): void {
    const card = element(this.cards, 'div', 'tfgpu-gpu-card');
    card.dataset.index = String(gpu.index);
    element(card, 'div', 'tfgpu-gpu-title', `GPU ${gpu.index} · ${(gpu.name ?? gpu.uuid).replace(/^NVIDIA /, '')}`);
    const total = gpu.memory_total ?? 0;
    const own = gpu.processes.find(p => p.kernel_id !== undefined && p.kernel_id === kernelId)?.gpu_memory ?? 0;
    const bar = element(card, 'div', 'tfgpu-bar');
    const used = element(bar, 'div', 'tfgpu-bar-used');
    const mine = element(bar, 'div', 'tfgpu-bar-this');
    if (total > 0) {
      used.style.width = `${(100 * Math.max(0, (gpu.memory_used ?? 0) - own)) / total}%`;
      mine.style.width = `${(100 * own) / total}%`;
    }
    const figures = [
      total > 0 ? gibPair(gpu.memory_used ?? 0, total) : 'memory ?',
      gpu.utilization === null ? 'utilization ?' : `${gpu.utilization}% busy`
    ];
    if (gpu.mig.length) {
      figures.push(`MIG ×${gpu.mig.length}`);
    }
    element(card, 'div', 'tfgpu-gpu-figures', figures.join(' · '));
    const list = element(card, 'ul', 'tfgpu-processes');
    if (!gpu.processes.length) {
      element(list, 'li', 'tfgpu-process tfgpu-none', 'no process');
    }
    for (const proc of gpu.processes) {
      this.process(list, proc, kernelId);
    }
  }

  private process(list: HTMLElement, proc: IGpuProcess, kernelId: string | null): void {
    const isThis = proc.kernel_id !== undefined && proc.kernel_id === kernelId;
    const row = element(list, 'li', isThis ? 'tfgpu-process tfgpu-this' : 'tfgpu-process');
    const parts: string[] = [];
    if (proc.kernel_id !== undefined) {
      parts.push(proc.notebook ?? `kernel ${proc.kernel_id.slice(0, 8)}`, size(proc.gpu_memory));
      parts.push(proc.execution_state === 'busy' ? 'busy' : idle(proc.idle_seconds));
      if (proc.tensorflow) {
        parts.push(`TF ${proc.tensorflow}`);
      }
    } else {
      parts.push(`pid ${proc.pid}`, proc.user ?? '?', size(proc.gpu_memory));
    }
    element(row, 'span', 'tfgpu-process-text', parts.filter(part => part).join(' · ') + (isThis ? ' ← this notebook' : ''));
    row.title = `pid ${proc.pid}${proc.user ? ` · ${proc.user}` : ''}`;
    const kernel = proc.kernel_id;
    if (kernel !== undefined && proc.execution_state === 'idle' && !isThis) {
      const button = element(row, 'button', 'jp-Button tfgpu-shutdown', 'Shut down');
      button.title = 'Shut down this idle kernel (after a confirmation): its variables are lost, its GPU memory freed';
      button.addEventListener('click', () => void this.shutdown({ ...proc, kernel_id: kernel }));
    }
  }

  private readonly kernelLine: HTMLElement;
  private readonly message: HTMLElement;
  private readonly cards: HTMLElement;
}

/** Ask, then shut the kernel down through the server's own kernels API (`kernels.shutdown`). */
export async function confirmShutdown(
  notebook: string,
  shutdown: () => Promise<void>
): Promise<boolean> {
  const result = await showDialog({
    title: 'Shut down kernel?',
    body: `Shut down the kernel of ${notebook}? Its variables are lost; the GPU memory it holds is freed.`,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut down' })]
  });
  if (!result.button.accept) {
    return false;
  }
  await shutdown();
  return true;
}
