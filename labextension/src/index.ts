/**
 * tfgpu-magic: which notebook holds which GPU memory, under which TensorFlow policy, in JupyterLab 4 and
 * Notebook 7, answered by the server extension (tfgpu_magic/serverext) even while the kernel is busy.
 *
 * - a status bar item for the active notebook's kernel (where the app has a status bar);
 * - a sidebar with one card per GPU, the processes on it, and "Shut down" for this user's idle kernels;
 * - the command `tfgpu:restart-run-to-selected` (palette and Kernel menu): the kernel keeps its policy for
 *   its successor, then JupyterLab's own restart-and-run-to-selected brings the work back.
 * It asks the server only while the page is visible and something shows the answer, every few seconds.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';

import { IGpusReply, IKernelReply, requestAPI } from './api';
import { GpuSidebar, GpuStatus, SIDEBAR_ID, STATUS_ID, confirmShutdown } from './widgets';

export const COMMAND = 'tfgpu:restart-run-to-selected';
const PLUGIN_ID = 'tfgpu-magic:plugin';
/** Milliseconds between two polls (the issue asks for 2–5 s). */
export const POLL_MS = 3000;

/**
 * Run silently in the kernel before the restart: store its policy for the next kernel on the same
 * connection file (what `%tfgpu restart` stores; the profile's startup file applies it before the first
 * cell). Nothing to store where tfgpu_magic never made a policy in this kernel.
 */
const KEEP_POLICY = `
def _tfgpu_keep_policy():
    import sys
    if "tfgpu_magic.controller" not in sys.modules:
        return
    import tfgpu_magic
    from tfgpu_magic.jupyter.restart import keep_for_next_kernel
    keep_for_next_kernel(get_ipython(), tfgpu_magic.current_policy())
try:
    _tfgpu_keep_policy()
finally:
    del _tfgpu_keep_policy
`;

/** Store the kernel's policy for its successor; the error text when that failed, else null. */
async function keepPolicy(kernel: Kernel.IKernelConnection): Promise<string | null> {
  const future = kernel.requestExecute({ code: KEEP_POLICY, silent: true, store_history: false });
  const reply = await future.done;
  const content = reply.content;
  return content.status === 'error' ? `${content.ename}: ${content.evalue}` : null;
}

/** Polls the server while something visible needs the answer; renders into the status item and sidebar. */
class Monitor {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly status: GpuStatus | null,
    private readonly sidebar: GpuSidebar
  ) {
    document.addEventListener('visibilitychange', () => this.soon());
    tracker.currentChanged.connect(this.soon, this);
    tracker.widgetAdded.connect((_, panel) => panel.sessionContext.kernelChanged.connect(this.soon, this));
  }

  /** The active notebook's kernel id, if it has a kernel. */
  get kernelId(): string | null {
    return this.tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
  }

  /** Poll now, then every `POLL_MS`. */
  soon(): void {
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.tick(), 0);
  }

  private async tick(): Promise<void> {
    try {
      await this.refresh();
    } finally {
      window.clearTimeout(this.timer);
      this.timer = window.setTimeout(() => void this.tick(), POLL_MS);
    }
  }

  /** Ask only what is shown: nothing in a hidden tab, the kernel only with a notebook open. */
  private async refresh(): Promise<void> {
    if (document.visibilityState !== 'visible') {
      return;
    }
    const kernelId = this.kernelId;
    const sidebarShown = this.sidebar.isVisible;
    const statusShown = this.status !== null && this.status.isAttached;
    const [kernel, gpus] = await Promise.all([
      kernelId !== null && (statusShown || sidebarShown) ? this.ask<IKernelReply>(`kernels/${kernelId}`) : null,
      sidebarShown ? this.ask<IGpusReply>('gpus') : null
    ]);
    if (kernelId !== this.kernelId) {
      return; // the user switched notebooks meanwhile: the next poll asks about the new one
    }
    this.status?.render(kernel);
    this.sidebar.render(gpus, kernel, kernelId);
  }

  /** The reply, or null where the server has none (a kernel that just started, a server going down). */
  private async ask<T>(path: string): Promise<T | null> {
    try {
      return await requestAPI<T>(path);
    } catch (reason) {
      console.debug(`tfgpu-magic: ${path}:`, reason);
      return null;
    }
  }

  private timer = 0;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU status bar item, GPU sidebar and restart-with-policy command of tfgpu_magic.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null
  ): void => {
    const openSidebar = (): void => app.shell.activateById(SIDEBAR_ID);
    const sidebar = new GpuSidebar(async process => {
      const name = process.notebook ?? `kernel ${process.kernel_id}`;
      try {
        if (await confirmShutdown(name, () => app.serviceManager.kernels.shutdown(process.kernel_id))) {
          monitor.soon();
        }
      } catch (reason) {
        await showErrorMessage('Kernel not shut down', String(reason));
      }
    }, () => monitor.soon());
    app.shell.add(sidebar, 'right', { rank: 900 });
    let status: GpuStatus | null = null;
    if (statusBar) {
      status = new GpuStatus(openSidebar);
      statusBar.registerStatusItem(STATUS_ID, {
        item: status,
        align: 'left',
        rank: 900
      });
    }
    const monitor = new Monitor(tracker, status, sidebar);

    app.commands.addCommand(COMMAND, {
      label: 'Restart Kernel with the GPU Policy and Run up to Selected Cell…',
      caption: 'Keep the tfgpu policy for the new kernel, restart, and run the cells up to the selected one',
      isEnabled: () => !!tracker.currentWidget?.sessionContext.session?.kernel,
      execute: async () => {
        const kernel = tracker.currentWidget?.sessionContext.session?.kernel;
        if (!kernel) {
          return;
        }
        const failed = await keepPolicy(kernel);
        if (failed !== null) {
          await showErrorMessage('GPU policy not kept; the kernel was not restarted', failed);
          return;
        }
        await app.commands.execute('notebook:restart-and-run-to-selected', { activate: false });
        monitor.soon();
      }
    });
    palette?.addItem({ command: COMMAND, category: 'Kernel Operations' });
    monitor.soon();
  }
};

export default plugin;
