/**
 * The error codes of the server extension's replies in words (`$defs/errorCode` of
 * tfgpu_magic/jupyter/tfgpu-state.schema.json): inside a reply (`gpu_status.error`, a kernel's `error`)
 * and as the body of every reply that is not 200. The server sends a code and English for logs; the
 * browser words the code, through the `TranslationBundle` as words.ts does.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

import type { ErrorCode } from './api';
import type { IProblemText } from './words';

/** An error code in words: a few for the status bar (`short`), what it means, its fix. */
interface IErrorWords extends IProblemText {
  short: string;
}

/** The fix where the server's Python cannot check a kernel's state file. */
function jsonschemaFix(trans: TranslationBundle): string {
  return trans.__("Install it in the Jupyter server's environment (pip install 'jsonschema>=4.0'), then restart JupyterLab.");
}

function errorWords(trans: TranslationBundle, code: ErrorCode): IErrorWords {
  switch (code) {
    case 'nvml_missing':
      return {
        short: trans.__('NVML not installed'),
        what: trans.__("NVML is not installed for the Jupyter server's Python: no GPU figures."),
        fix: trans.__("Install it in the server's environment (pip install nvidia-ml-py), then restart JupyterLab.")
      };
    case 'no_driver':
      return {
        short: trans.__('no NVIDIA driver'),
        what: trans.__('No NVIDIA driver on this machine: no GPU to show.'),
        fix: trans.__('On a GPU machine: install the driver, or start the container with its GPUs (docker run --gpus all).')
      };
    case 'nvml_failed':
      return {
        short: trans.__('NVML did not start'),
        what: trans.__('NVML did not start: no GPU figures.'),
        fix: trans.__('Run %tfgpu doctor in a notebook to see why.')
      };
    case 'driver_not_answering':
      return {
        short: trans.__('driver not answering'),
        what: trans.__('The NVIDIA driver is not answering: the figures are its last good ones.'),
        fix: trans.__('Run %tfgpu doctor in a notebook; nvidia-smi may hang too.')
      };
    case 'state_invalid':
      return {
        short: trans.__('state file not ours'),
        what: trans.__("This kernel's tfgpu state file is not one tfgpu_magic wrote: its policy is not shown."),
        fix: trans.__('Restart the kernel; it writes the file anew.')
      };
    case 'jsonschema_missing':
      return {
        short: trans.__('jsonschema not installed'),
        what: trans.__("jsonschema is not installed for the Jupyter server's Python: it cannot check this kernel's state file, so its policy is not shown."),
        fix: jsonschemaFix(trans)
      };
    case 'jsonschema_old':
      return {
        short: trans.__('jsonschema too old'),
        what: trans.__("The Jupyter server's jsonschema is older than 4.0: it cannot check this kernel's state file, so its policy is not shown."),
        fix: jsonschemaFix(trans)
      };
    case 'unknown_kernel':
      return {
        short: trans.__('kernel unknown'),
        what: trans.__('The Jupyter server has no such kernel: it stopped or restarted.'),
        fix: ''
      };
    case 'bad_since':
      return {
        short: trans.__('bad request'),
        what: trans.__('The server refused the request for the memory history.'),
        fix: trans.__('Reload this page.')
      };
    case 'policy_refused':
      return {
        short: trans.__('policy refused'),
        what: trans.__("The kernel's GPU policy breaks the policy's rules: it was not kept for the new kernel."),
        fix: trans.__('Run %tfgpu in the notebook to see the policy, mend it, then restart.')
      };
    case 'keep_failed':
      return {
        short: trans.__('policy not stored'),
        what: trans.__('The server could not store the GPU policy for the new kernel.'),
        fix: trans.__("The Jupyter server's log says why (a full disk, a read-only runtime directory).")
      };
    case 'version_mismatch':
      return {
        short: trans.__('versions differ'),
        what: trans.__('The tfgpu_magic server extension and this page speak different versions.'),
        fix: trans.__('Restart JupyterLab, then reload this page.')
      };
    case 'forbidden':
      return {
        short: trans.__('not allowed'),
        what: trans.__('The Jupyter server refused the GPU request: not logged in, or not allowed.'),
        fix: trans.__('Log in again, then reload this page.')
      };
    case 'server_error':
      return {
        short: trans.__('server error'),
        what: trans.__('The GPU request failed in the Jupyter server.'),
        fix: trans.__("The Jupyter server's log says why.")
      };
  }
}

/** What an error code of a reply means, and its fix. */
export function errorText(trans: TranslationBundle, code: ErrorCode): IProblemText {
  const { what, fix } = errorWords(trans, code);
  return { what, fix };
}

/** An error code in a few words, for the status bar: `no NVIDIA driver`. */
export function errorShort(trans: TranslationBundle, code: ErrorCode): string {
  return errorWords(trans, code).short;
}
