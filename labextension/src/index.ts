/**
 * tfgpu-magic: which notebook holds which GPU memory, under which TensorFlow policy, in JupyterLab 4 and
 * Notebook 7, answered by the server extension (tfgpu_magic/serverext) even while the kernel is busy.
 *
 * - one model (`model.ts`) polls the server for what is shown, through `@lumino/polling`, standing by
 *   while the page has lost its server (`JupyterLab.IInfo.isConnected`);
 * - a status bar item for the active notebook's kernel (where the app has a status bar);
 * - a sidebar with one card per GPU, the processes on it, and "Shut down" for this user's idle kernels;
 * - the command `tfgpu:restart-run-to-selected` (palette and Kernel menu, `restart.ts`);
 * - the command `tfgpu:save-policy-to-notebook` (palette and the notebook's context menu, `notebookpolicy.ts`).
 * The refresh rate is a setting (schema/plugin.json, `ISettingRegistry`); every word goes through
 * `ITranslator` (domain `tfgpu_magic`).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin, JupyterLab } from '@jupyterlab/application';
import { Dialog, ICommandPalette, ISessionContextDialogs, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, TranslationBundle, nullTranslator } from '@jupyterlab/translation';
import { Signal } from '@lumino/signaling';

import type { IKernelRef } from './api';
import { DEFAULT_REFRESH_MS, GpuModel, IDemand } from './model';
import { SAVE_POLICY_COMMAND, savePolicyToNotebook } from './notebookpolicy';
import { COMMAND, JUPYTERLAB_COMMAND, Plan, caption, plan, restartRunToSelected } from './restart';
import { GpuSidebar, SIDEBAR_ID, kernelName } from './sidebar';
import { GpuStatus, STATUS_ID } from './status';

const PLUGIN_ID = 'tfgpu-magic:plugin';
/** The translation domain (the Python package's name, as JupyterLab language packs name domains). */
const DOMAIN = 'tfgpu_magic';

/** Ask, then shut the kernel down through the server's own kernels API; whether it was. */
async function confirmShutdown(trans: TranslationBundle, kernel: IKernelRef, shutdown: () => Promise<void>): Promise<boolean> {
  const result = await showDialog({
    title: trans.__('Shut down kernel?'),
    body: trans.__(
      'Shut down the kernel of %1? Its variables are lost; the GPU memory it holds is freed.',
      kernelName(trans, kernel)
    ),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: trans.__('Shut down') })]
  });
  if (!result.button.accept) {
    return false;
  }
  await shutdown();
  return true;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU status bar item, GPU sidebar and restart-with-policy command of tfgpu_magic.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, ISettingRegistry, ITranslator, ISessionContextDialogs, JupyterLab.IInfo],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null,
    sessionDialogs: ISessionContextDialogs | null,
    info: JupyterLab.IInfo | null
  ): void => {
    const translation = translator ?? nullTranslator;
    const trans = translation.load(DOMAIN);
    const kernelId = (): string | null => tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;

    let sidebar: GpuSidebar | null = null;
    let status: GpuStatus | null = null;
    const model = new GpuModel({
      refreshRate: DEFAULT_REFRESH_MS,
      demand: (): IDemand => {
        const sidebarShown = sidebar?.isVisible ?? false;
        const statusShown = status?.isVisible ?? false;
        const id = kernelId();
        return { kernelId: id !== null && (sidebarShown || statusShown) ? id : null, gpus: sidebarShown };
      },
      // false while JupyterLab shows its "Server Connection Error" dialog: the poll stands by
      connected: (): boolean => info?.isConnected ?? true
    });
    const refresh = (): void => void model.refresh();

    sidebar = new GpuSidebar(
      model,
      trans,
      kernelId,
      async kernel => {
        try {
          if (await confirmShutdown(trans, kernel, () => app.serviceManager.kernels.shutdown(kernel.kernel_id))) {
            refresh();
          }
        } catch (reason) {
          await showErrorMessage(trans.__('Kernel not shut down'), String(reason));
        }
      },
      refresh
    );
    app.shell.add(sidebar, 'right', { rank: 900 });

    const notebookChanged = new Signal<GpuModel, void>(model);
    if (statusBar) {
      status = new GpuStatus(model, trans, kernelId, () => app.shell.activateById(SIDEBAR_ID));
      statusBar.registerStatusItem(STATUS_ID, {
        item: status,
        align: 'left',
        rank: 900,
        isActive: () => tracker.currentWidget !== null,
        activeStateChanged: notebookChanged
      });
    }

    // a view shows another kernel: render it now, and ask about it
    const kernelShown = (): void => {
      notebookChanged.emit();
      status?.update();
      sidebar?.update();
      refresh();
    };
    tracker.currentChanged.connect(kernelShown);
    tracker.widgetAdded.connect((_, panel) => panel.sessionContext.kernelChanged.connect(kernelShown));
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') {
        refresh();
      }
    });

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = (): void => {
            model.refreshRate = settings.get('refreshRate').composite as number;
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.warn(`tfgpu-magic: settings not loaded, polling every ${DEFAULT_REFRESH_MS / 1000} s:`, reason));
    }

    const currentPlan = (): Plan =>
      plan(tracker.currentWidget, model, app.serviceManager.kernelspecs.specs, model.kernel(kernelId())?.reply ?? null);
    app.commands.addCommand(COMMAND, {
      label: trans.__('Restart Kernel with the GPU Policy and Run up to Selected Cell…'),
      caption: () => caption(trans, currentPlan()),
      isEnabled: () => !!tracker.currentWidget?.sessionContext.session?.kernel,
      execute: async () => {
        const panel = tracker.currentWidget;
        if (!panel) {
          return false;
        }
        return restartRunToSelected(panel, model, {
          trans,
          translator: translation,
          specs: app.serviceManager.kernelspecs.specs,
          sessionDialogs,
          runJupyterLabs: () => app.commands.execute(JUPYTERLAB_COMMAND, { activate: false })
        });
      }
    });
    let shownPlan = ''; // the caption follows the plan's `keep` or `why` alone: compare those, not its words
    model.stateChanged.connect(() => {
      const planned = currentPlan();
      const now = planned.keep ? 'keep' : planned.why;
      if (now !== shownPlan) {
        shownPlan = now;
        app.commands.notifyCommandChanged(COMMAND);
      }
    });
    palette?.addItem({ command: COMMAND, category: trans.__('Kernel Operations') });

    app.commands.addCommand(SAVE_POLICY_COMMAND, {
      label: trans.__('Save GPU Policy to Notebook Metadata'),
      caption: trans.__(
        "Put this kernel's GPU policy into the notebook's metadata (tfgpu.policy), so its kernel starts with it next time; then save the notebook"
      ),
      isEnabled: () => !!tracker.currentWidget?.sessionContext.session?.kernel,
      execute: async () => {
        const panel = tracker.currentWidget;
        return panel ? savePolicyToNotebook(panel, trans) : false;
      }
    });
    palette?.addItem({ command: SAVE_POLICY_COMMAND, category: trans.__('Notebook Operations') });
    app.contextMenu.addItem({ command: SAVE_POLICY_COMMAND, selector: '.jp-Notebook', rank: 90 });
  }
};

export default plugin;
