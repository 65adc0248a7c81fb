/**
 * Text for the status bar and the sidebar: sizes as people read a card, idle times, the status line.
 * Sizes follow the panel (tfgpu_magic/views/panel.py `gib_pair`): `20.0 / 80 GiB`.
 */
import type { IKernelReply } from './api';

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

/** Used / total as people read a card: `20.0 / 80 GiB` (MiB on cards under 1 GiB). */
export function gibPair(used: number, total: number): string {
  if (total < GIB) {
    return `${Math.round(used / MIB)} / ${Math.round(total / MIB)} MiB`;
  }
  const whole = total % GIB === 0 ? `${total / GIB}` : (total / GIB).toFixed(1);
  return `${(used / GIB).toFixed(1)} / ${whole} GiB`;
}

/** One size: `512 MiB`, `3.5 GiB`; `?` when unknown. */
export function size(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '?';
  }
  return bytes >= GIB ? `${(bytes / GIB).toFixed(1)} GiB` : `${Math.round(bytes / MIB)} MiB`;
}

/** `idle 42s`, `idle 5m`, `idle 2h05m` (as `%tfgpu who` says it); '' when unknown. */
export function idle(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  if (seconds < 60) {
    return `idle ${Math.floor(seconds)}s`;
  }
  if (seconds < 3600) {
    return `idle ${Math.floor(seconds / 60)}m`;
  }
  const minutes = Math.floor((seconds % 3600) / 60);
  return `idle ${Math.floor(seconds / 3600)}h${String(minutes).padStart(2, '0')}m`;
}

/** Which cards the kernel's status names: `GPU 0,1`, `all GPUs`, `no GPU`. */
export function gpuLabel(reply: IKernelReply): string {
  if (reply.gpus.length === 0) {
    return reply.gpu_error && reply.gpus_from !== 'policy' ? 'GPU ?' : 'no GPU';
  }
  if (reply.gpus_from === 'all' && reply.gpus.length > 1) {
    return 'all GPUs';
  }
  return `GPU ${reply.gpus.map(gpu => gpu.index).join(',')}`;
}

/** The status bar's line: `GPU 0,1 · growth on · 3.1 / 80 GiB · TF initialized · restart pending`. */
export function statusLine(reply: IKernelReply): string {
  const parts = [gpuLabel(reply)];
  if (!reply.published) {
    parts.push('tfgpu not loaded');
  } else {
    parts.push(reply.settings.length ? reply.settings.join(', ') : 'no policy');
  }
  const total = reply.gpus.reduce((sum, gpu) => sum + (gpu.memory_total ?? 0), 0);
  if (total > 0) {
    parts.push(gibPair(reply.gpus.reduce((sum, gpu) => sum + (gpu.kernel_memory ?? 0), 0), total));
  }
  parts.push(reply.tensorflow ? `TF ${reply.tensorflow}` : 'TF ?');
  if (reply.restart_needed) {
    parts.push('restart pending');
  }
  return parts.join(' · ');
}

/** The tooltip: TensorFlow's state in full and what waits for a restart. */
export function statusTitle(reply: IKernelReply): string {
  const lines = [];
  if (reply.tensorflow_label) {
    const by = reply.initialized_by ? ` (${reply.initialized_by})` : '';
    lines.push(`TensorFlow: ${reply.tensorflow_label}${by}`);
  }
  if (reply.policy_text.length) {
    lines.push(`Policy: ${reply.policy_text.join(', ')}`);
  }
  for (const group of reply.pending) {
    lines.push(`${group.title}:`, ...group.items.map(item => `  - ${item}`));
  }
  if (reply.gpu_error) {
    lines.push(reply.gpu_error);
  }
  lines.push('Click for the GPU sidebar.');
  return lines.join('\n');
}
