/**
 * The status bar item: the active notebook's kernel in one line, with what keeps its figures from being
 * shown (`no NVIDIA driver`, `stale: 42 s old`), or only that (`GPU: server extension off`).
 * A view of the model (`VDomRenderer`: React updates the line in place at every poll). It is a button
 * for the sidebar: a click, Enter or Space opens it.
 */
import type { TranslationBundle } from '@jupyterlab/translation';
import { VDomRenderer } from '@jupyterlab/ui-components';
import React from 'react';

import { StaleMark } from './age';
import type { GpuModel } from './model';
import { problems } from './problems';
import { errorShort, failureShort, statusDetails, statusLine } from './words';

export const STATUS_ID = 'tfgpu-statusbar';

export class GpuStatus extends VDomRenderer<GpuModel> {
  constructor(
    model: GpuModel,
    private readonly trans: TranslationBundle,
    private readonly kernelId: () => string | null,
    open: () => void
  ) {
    super(model);
    this.id = STATUS_ID;
    this.addClass('tfgpu-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.tabIndex = 0;
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', open);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        open();
      }
    });
  }

  /** The line; the node's tooltip, label and classes follow it (they are the item's own attributes). */
  protected render(): JSX.Element {
    const trans = this.trans;
    const kernelId = this.kernelId();
    const received = this.model.kernel(kernelId);
    const failure = this.model.failure;
    const found = problems(trans, this.model, kernelId, false);
    const errors = received ? [received.reply.error, received.reply.gpu_status.error] : [];
    const line = received
      ? [statusLine(trans, received.reply), ...errors.flatMap(error => (error ? [errorShort(trans, error.code)] : []))].join(' · ')
      : failure
        ? failureShort(trans, failure)
        : '';
    const details = [
      ...(received ? statusDetails(trans, received.reply) : []),
      ...found.flatMap(problem => [problem.what, ...(problem.fix ? [problem.fix] : [])]),
      trans.__('Click for the GPU sidebar.')
    ];
    this.node.title = line ? details.join('\n') : '';
    this.node.setAttribute('aria-label', line ? trans.__('%1 (opens the GPU sidebar)', line) : trans.__('GPU sidebar'));
    this.toggleClass('tfgpu-pending', !!received?.reply.restart_needed);
    this.toggleClass('tfgpu-has-problem', found.length > 0);
    return (
      <>
        {line}
        <StaleMark trans={trans} received={received} failing={failure !== null} prefix=" · " />
      </>
    );
  }
}
