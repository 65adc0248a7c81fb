/**
 * words.ts: where TensorFlow's runtime was initialized, as the kernel publishes it (`initialized_by`). Before
 * tfgpu_magic could watch, the kernel publishes the cell running then as a number (`execution_count`);
 * older kernels published that place in words (`line`). Both read as the magic's status says it
 * (`tfgpu_magic/views/tfstate.py`, `init_text`).
 */
import type { IKernelReply } from '../api';
import { statusDetails } from '../words';
import { trans } from './trans';

/** A kernel reply whose TensorFlow runtime was initialized as `by` says (only what the first line reads). */
function initialized(by: { where: string; execution_count: number | null; line: string | null }): IKernelReply {
  return {
    kernel: { tensorflow: 'initialized' },
    tensorflow: { state: 'initialized', cuda_started: true, initialized_by: by, memory: [] },
    frameworks: { jax: null, torch: null, keras: null },
    policy: null,
    pending: []
  } as unknown as IKernelReply;
}

describe('statusDetails: initialized before the watch', () => {
  it.each([
    [{ where: 'before_watch', execution_count: 2, line: null }, 'before tfgpu_magic could watch (in In [2])'],
    [{ where: 'before_watch', execution_count: null, line: null }, 'before tfgpu_magic could watch (in IPython)'],
    [{ where: 'before_watch', execution_count: null, line: 'in In [5]' }, 'before tfgpu_magic could watch (in In [5])']
  ])('%j reads as the magic says it', (by, text) => {
    expect(statusDetails(trans, initialized(by))[0]).toBe(`TensorFlow: initialized ${text}`);
  });
});
