/**
 * "Restart Kernel with the GPU Policy and Run up to Selected Cell…" (`tfgpu:restart-run-to-selected`).
 *
 * It never runs code in the kernel, so it never waits for the running cell: its dialog comes at once,
 * whatever the kernel is doing (busy in Python, stuck in C, hung). On Restart the server stores the
 * policy the kernel already published for the next kernel on its connection file (`POST
 * api/tfgpu/kernels/<id>/keep`, authenticated and XSRF-checked as every request of ours), then the
 * kernel restarts as JupyterLab's own restart does, and the cells up to the selected one run as
 * JupyterLab's `notebook:restart-and-run-to-selected` runs them (`NotebookActions.runCells`). Cancel
 * stores nothing. Where the policy cannot be kept (no tfgpu_magic in the kernel, not Python, no answer,
 * no server extension), JupyterLab's own command runs, and the command's caption says why.
 */
import { Dialog, ISessionContextDialogs, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import type { KernelSpec } from '@jupyterlab/services';
import type { ITranslator, TranslationBundle } from '@jupyterlab/translation';

import { IKernelReply, RequestFailure, keepPolicy } from './api';
import type { GpuModel } from './model';
import { failureText, policyPhrases } from './words';

export const COMMAND = 'tfgpu:restart-run-to-selected';
/** JupyterLab's own command, for kernels whose policy cannot be kept. */
export const JUPYTERLAB_COMMAND = 'notebook:restart-and-run-to-selected';
/** How long the command waits for a fresh answer about the kernel before it decides on the last one. */
const DECIDE_WAIT_MS = 1500;

/** Whether the policy can be kept, and why not. */
export type Plan =
  | { keep: true; reply: IKernelReply }
  | {
      keep: false;
      why: 'no-kernel' | 'not-python' | 'extension-missing' | 'no-reply' | 'not-published' | 'state-invalid' | 'state-unchecked' | 'no-keep';
    };

/** What the command will do for `panel`'s kernel, from the model's last answer about it. */
export function plan(
  panel: NotebookPanel | null,
  model: GpuModel,
  specs: KernelSpec.ISpecModels | null,
  reply: IKernelReply | null
): Plan {
  const kernel = panel?.sessionContext.session?.kernel ?? null;
  if (kernel === null) {
    return { keep: false, why: 'no-kernel' };
  }
  const language = specs?.kernelspecs[kernel.name]?.language;
  if (language !== undefined && language.toLowerCase() !== 'python') {
    return { keep: false, why: 'not-python' };
  }
  if (model.failure?.kind === 'extension-missing') {
    return { keep: false, why: 'extension-missing' };
  }
  if (reply === null) {
    return { keep: false, why: 'no-reply' };
  }
  if (reply.error?.code === 'state_invalid') {
    return { keep: false, why: 'state-invalid' };
  }
  if (reply.error?.code === 'jsonschema_missing' || reply.error?.code === 'jsonschema_old') {
    return { keep: false, why: 'state-unchecked' };
  }
  if (!reply.published) {
    return { keep: false, why: 'not-published' };
  }
  return reply.keep ? { keep: true, reply } : { keep: false, why: 'no-keep' };
}

/** The command's caption: what it does, or why the policy is not kept. */
export function caption(trans: TranslationBundle, planned: Plan): string {
  if (planned.keep) {
    return trans.__(
      'Store the GPU policy this kernel published for the new kernel, restart without waiting for the running cell, and run the cells up to the selected one'
    );
  }
  const reasons: Record<typeof planned.why, string> = {
    'no-kernel': trans.__('the notebook has no kernel'),
    'not-python': trans.__('the kernel is not Python'),
    'extension-missing': trans.__('the tfgpu_magic server extension is off'),
    'no-reply': trans.__('the server has said nothing about this kernel yet'),
    'state-invalid': trans.__("the kernel's state file is not one tfgpu_magic wrote"),
    'state-unchecked': trans.__("the server cannot check the kernel's state file: its jsonschema is missing or older than 4.0"),
    'not-published': trans.__('tfgpu_magic is not loaded in this kernel'),
    'no-keep': trans.__("a kept policy would not be applied: tfgpu_magic's startup file is not in the kernel's IPython profile")
  };
  const why = reasons[planned.why];
  return trans.__("No GPU policy is kept (%1): JupyterLab's Restart Kernel and Run up to Selected Cell", why);
}

/** Run the command on `panel` (the current notebook). */
export async function restartRunToSelected(
  panel: NotebookPanel,
  model: GpuModel,
  options: {
    trans: TranslationBundle;
    translator: ITranslator;
    specs: KernelSpec.ISpecModels | null;
    sessionDialogs: ISessionContextDialogs | null;
    runJupyterLabs: () => Promise<unknown>;
  }
): Promise<boolean> {
  const { trans } = options;
  const kernel = panel.sessionContext.session?.kernel ?? null;
  // the last answer where it lets the policy be kept (the dialog comes at once); else one asked now
  // (the server answers from what the kernel published, busy or not), for at most DECIDE_WAIT_MS
  let planned = plan(panel, model, options.specs, model.kernel(kernel?.id ?? null)?.reply ?? null);
  if (!planned.keep && kernel !== null) {
    planned = plan(panel, model, options.specs, await model.freshKernel(kernel.id, DECIDE_WAIT_MS));
  }
  if (!planned.keep || kernel === null) {
    await options.runJupyterLabs();
    return false;
  }
  const { content, sessionContext } = panel;
  const cells = content.widgets.slice(0, content.activeCellIndex + 1);
  const policy = planned.reply.policy ? policyPhrases(trans, planned.reply.policy) : [];
  const result = await showDialog({
    title: trans.__('Restart Kernel?'),
    body: trans.__(
      'Do you want to restart the kernel of %1? All variables will be lost. Its GPU policy (%2) will be in force in the new kernel before its first cell, then the cells up to the selected one run again.',
      sessionContext.name,
      policy.length ? policy.join(', ') : trans.__("TensorFlow's defaults")
    ),
    buttons: [
      Dialog.cancelButton({ ariaLabel: trans.__('Cancel Kernel Restart') }),
      Dialog.warnButton({ label: trans.__('Restart'), ariaLabel: trans.__('Confirm Kernel Restart') })
    ]
  });
  if (!result.button.accept || kernel.isDisposed || sessionContext.session?.kernel !== kernel) {
    return false;
  }
  try {
    await keepPolicy(kernel.id);
  } catch (reason) {
    await showErrorMessage(trans.__('GPU policy not kept; the kernel was not restarted'), refusalText(trans, reason));
    return false;
  }
  await sessionContext.restartKernel();
  void model.refresh();
  await NotebookActions.runCells(
    content,
    cells,
    sessionContext,
    options.sessionDialogs ?? undefined,
    options.translator
  );
  return true;
}

/** Why the server did not keep the policy, worded from its error body's code (`failureText`; the server's English
 * only as the detail after it). */
function refusalText(trans: TranslationBundle, reason: unknown): string {
  if (!(reason instanceof RequestFailure)) {
    return String(reason);
  }
  const { what, fix } = failureText(trans, reason);
  return [what, fix, trans.__('Server: %1', reason.message)].filter(line => line !== '').join('\n');
}
