/**
 * The browser words the data (the replies carry English only in an error's `message`): the policy,
 * TensorFlow's state, each pending change, errors by their code, failures of the requests themselves,
 * ages. Every phrase goes through the `TranslationBundle` (`trans.__`, `trans._n`), as
 * jupyter-resource-usage's labextension does; sizes come from `sizes.ts` and are units, not words.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

import type {
  FailureKind,
  FrameworkState,
  RequestFailure,
  IFramework,
  IFrameworkMemory,
  IFrameworks,
  IInitializedBy,
  IKernelReply,
  IPendingChange,
  IPolicy,
  LockReason,
  SettingValue,
  TensorFlowState
} from './api';
import { errorShort, errorText } from './errorwords';
import type { FrameworkSource, IPoint } from './history';
import { bytesText, directiveSize, gibPair, splitSize } from './sizes';

/** The server extension's module, as `jupyter server extension enable` names it. */
const SERVER_EXTENSION = 'tfgpu_magic.serverext';
/** How many characters of a GPU UUID a status shows (`GPU-8932f937`; tfgpu_magic/language/policy.py). */
const SHORT_UUID = 'GPU-8932f937'.length;

/** A problem worded for people: what it is, and what fixes it (empty where nothing does). */
export interface IProblemText {
  what: string;
  fix: string;
}

/** `GPU 1, 2` (one `GPU` for the indices), then any UUID cut short (`gpu_names`). */
function gpuRefs(trans: TranslationBundle, refs: string[]): string {
  const indices = refs.filter(isIndex);
  const others = refs.filter(ref => !isIndex(ref)).map(shortUuid);
  return [...(indices.length ? [trans.__('GPU %1', indices.join(', '))] : []), ...others].join(', ');
}

function isIndex(ref: string): boolean {
  return /^[0-9]+$/.test(ref);
}

function shortUuid(ref: string): string {
  return ref.length > SHORT_UUID + 1 ? `${ref.slice(0, SHORT_UUID)}…` : ref;
}

/** `limit 2GB on GPU 0, 1, 4GB on every other visible GPU`: a size as the directive writes it, a share
 * of the card as given with what it comes to (`50% (40.0 GiB) on GPU 1`); null without limits. */
function policyLimits(trans: TranslationBundle, policy: IPolicy): string | null {
  const bySize = new Map<string, string[]>();
  let everyGpu: number | null = null;
  for (const limit of policy.limits) {
    if (limit.gpu === 'all') {
      everyGpu = limit.bytes;
      continue;
    }
    const size = limit.written ? `${limit.written} (${bytesText(limit.bytes)})` : directiveSize(limit.bytes);
    bySize.set(size, [...(bySize.get(size) ?? []), limit.gpu]);
  }
  const each = [...bySize].map(([size, gpus]) => trans.__('%1 on %2', size, gpuRefs(trans, gpus)));
  if (everyGpu !== null) {
    const others = each.length || policy.splits.length;
    const which = others ? trans.__('every other visible GPU') : trans.__('every visible GPU');
    each.push(trans.__('%1 on %2', directiveSize(everyGpu), which));
  }
  return each.length ? trans.__('limit %1', each.join(', ')) : null;
}

/** The policy's settings other than `visible`, as the magic's status phrases them (`describe_policy`):
 * `growth on`, `limit 2GB on GPU 0`, `split 0 2x1GB`, `split cpu into 2 logical devices`, `allocator
 * async`, `loglevel error`. */
function policySettings(trans: TranslationBundle, policy: IPolicy): string[] {
  const phrases: string[] = [];
  if (policy.growth !== null) {
    phrases.push(policy.growth ? trans.__('growth on') : trans.__('growth off'));
  }
  const limits = policyLimits(trans, policy);
  if (limits !== null) {
    phrases.push(limits);
  }
  for (const split of policy.splits) {
    const gpu = shortUuid(split.gpu); // an index is never long enough to be cut
    phrases.push(trans.__('split %1 %2', gpu, splitSize(split.bytes)));
  }
  if (policy.cpu_devices !== null) {
    phrases.push(
      trans._n('split cpu into %1 logical device', 'split cpu into %1 logical devices', policy.cpu_devices)
    );
  }
  if (policy.allocator !== null) {
    phrases.push(trans.__('allocator %1', policy.allocator));
  }
  if (policy.loglevel !== null) {
    phrases.push(trans.__('loglevel %1', policy.loglevel));
  }
  return phrases;
}

/** `visible 0,1` (`visible none`, `visible 0, GPU-8932f937…`, `visible 0 (auto: freest first)`); null
 * where the policy leaves visibility to TensorFlow. */
function policyVisible(trans: TranslationBundle, policy: IPolicy): string | null {
  if (policy.visible === null) {
    return null;
  }
  const refs = policy.visible.every(isIndex) ? policy.visible.join(',') : policy.visible.map(shortUuid).join(', ');
  const phrase = trans.__('visible %1', refs || trans.__('none'));
  return policy.visible_auto ? trans.__('%1 (auto: freest first)', phrase) : phrase;
}

/** The whole policy: visible first, as TensorFlow applies it. */
export function policyPhrases(trans: TranslationBundle, policy: IPolicy): string[] {
  const visible = policyVisible(trans, policy);
  return [...(visible === null ? [] : [visible]), ...policySettings(trans, policy)];
}

/** TensorFlow's state: `not imported`, `imported`, `initialized`. */
export function tensorflowState(trans: TranslationBundle, state: TensorFlowState): string {
  switch (state) {
    case 'not_imported':
      return trans.__('not imported');
    case 'imported':
      return trans.__('imported');
    case 'initialized':
      return trans.__('initialized');
  }
}

/** Where TensorFlow was initialized, worded to follow "initialized": `by In [7]: model.fit(x, y)`. */
function initializedBy(trans: TranslationBundle, by: IInitializedBy): string {
  switch (by.where) {
    case 'cell':
      return trans.__('by In [%1]: %2', by.execution_count ?? '?', by.line ?? '');
    case 'outside_cell':
      return by.execution_count
        ? trans.__('outside a cell (a startup file, an extension, a silent request or a thread), before In [%1]', by.execution_count)
        : trans.__('outside a cell (a startup file, an extension, a silent request or a thread)');
    case 'before_watch': // the cell running when the watch began (`line`: that place in words, from older kernels)
      return by.execution_count
        ? trans.__('before tfgpu_magic could watch (in In [%1])', by.execution_count)
        : by.line
          ? trans.__('before tfgpu_magic could watch (%1)', by.line)
          : trans.__('before tfgpu_magic could watch (in IPython)');
  }
}

/** A setting's value as the status shows it: `TF default`, `on`, `2 logical devices`, `1.0 GiB + 1.0 GiB`. */
export function settingValue(trans: TranslationBundle, value: SettingValue, variable = false): string {
  if (variable) {
    return typeof value === 'string' && value ? value : trans.__('unset');
  }
  if (value === null) {
    return trans.__('TF default');
  }
  if (typeof value === 'boolean') {
    return value ? trans.__('on') : trans.__('off');
  }
  if (typeof value === 'string') {
    return value;
  }
  if (value.length === 0) {
    return trans.__('none');
  }
  if (typeof value[0] === 'string') {
    return (value as string[]).join(', ');
  }
  const devices = value as Exclude<SettingValue, null | boolean | string | string[]>;
  if (devices.every(device => device.memory === null)) {
    return trans._n('%1 logical device', '%1 logical devices', devices.length);
  }
  return devices
    .map(device => {
      const size = device.memory === null ? trans.__('one logical device') : directiveSize(device.memory);
      const extras = [
        ...(device.priority !== null && device.priority !== undefined ? [trans.__('priority %1', device.priority)] : []),
        ...(device.ordinal !== null && device.ordinal !== undefined ? [trans.__('ordinal %1', device.ordinal)] : [])
      ];
      return extras.length ? `${size} (${extras.join(', ')})` : size;
    })
    .join(' + ');
}

/** One pending change: `logical CPU devices: TF default → 2 logical devices` and why it waits. */
export function pendingChange(trans: TranslationBundle, change: IPendingChange): string {
  const settings: Record<IPendingChange['setting'], string> = {
    visible: trans.__('visible GPUs'),
    logical: trans.__('logical devices of %1', change.device),
    cpus: trans.__('logical CPU devices'),
    growth: trans.__('memory growth of %1', change.device),
    variable: change.device
  };
  const setting = settings[change.setting];
  const variable = change.setting === 'variable';
  const text = trans.__(
    '%1: %2 → %3',
    setting,
    settingValue(trans, change.now, variable),
    settingValue(trans, change.wanted, variable)
  );
  const reasons: Record<LockReason, string | null> = {
    initialized: null, // the reason a status names once, not per change
    devices_created: trans.__('the GPU devices were created already'),
    import: trans.__('read when TensorFlow was imported'),
    cuda_start: trans.__('read when CUDA started'),
    allocator_creation: trans.__('read when TensorFlow created the GPU allocators'),
    jax_backends: trans.__("read when JAX's backends started"),
    torch_cuda: trans.__("read when PyTorch's CUDA started"),
    torch_import: trans.__('read when PyTorch was imported'),
    no_call: trans.__('TensorFlow has no call for it in this process')
  };
  const why = change.why === null ? null : reasons[change.why];
  return why ? trans.__('%1 (%2)', text, why) : text;
}

/** The pending changes in their two groups, each titled: those only a restart can make, then those
 * `%tfgpu apply` still can. */
function pendingGroups(trans: TranslationBundle, pending: IPendingChange[]): { title: string; items: string[] }[] {
  const groups = [
    { title: trans.__('Pending, needs a restart'), restart: true },
    { title: trans.__('Not applied yet (%tfgpu apply)'), restart: false }
  ];
  return groups
    .map(group => ({
      title: group.title,
      items: pending.filter(change => change.needs_restart === group.restart).map(change => pendingChange(trans, change))
    }))
    .filter(group => group.items.length);
}

/** The other frameworks by the names their key has in `$defs/frameworks`. */
export type FrameworkName = keyof IFrameworks;

/** How each framework is called (names, not words: not translated; `FRAMEWORK_LABELS` in
 * tfgpu_magic/views/status.py). */
export const FRAMEWORK_LABELS: Record<FrameworkName, string> = { jax: 'JAX', torch: 'PyTorch', keras: 'Keras' };

/** One other framework as the kernel's status says it (`framework_rows`): its label and its line. */
export interface IFrameworkRow {
  name: FrameworkName;
  label: string;
  line: string;
}

/** Where JAX or PyTorch is in its life; once started, what that fixes. */
function frameworkState(trans: TranslationBundle, name: 'jax' | 'torch', state: FrameworkState): string {
  if (state === 'not_imported') {
    return trans.__('not imported');
  }
  if (name === 'jax') {
    return state === 'started'
      ? trans.__("backends started: its XLA_* settings are fixed until restart")
      : trans.__('imported, backends not started');
  }
  return state === 'started'
    ? trans.__('CUDA started: its allocator settings are fixed until restart')
    : trans.__('imported, CUDA not started');
}

/** A fraction as Python's `f"{fraction:g}"` writes those of a card (six significant digits). */
function fractionText(fraction: number): string {
  return String(Number(fraction.toPrecision(6)));
}

/** PyTorch's memory fractions: `memory fraction 0.5 on GPU 0, 1` or each its own (a soft cap). */
function torchFractions(trans: TranslationBundle, framework: IFramework): string | null {
  const fractions = framework.fractions;
  if (!fractions.length) {
    return null;
  }
  const shares = new Set(fractions.map(entry => entry.fraction));
  const phrase =
    shares.size === 1
      ? trans.__(
          'memory fraction %1 on GPU %2',
          fractionText(fractions[0].fraction),
          fractions.map(entry => entry.device).join(', ')
        )
      : trans.__(
          'memory fractions %1',
          fractions.map(entry => trans.__('GPU %1: %2', entry.device, fractionText(entry.fraction))).join(', ')
        );
  return trans.__("%1 (a soft cap: its caching allocator stops there; CUDA's own context is extra)", phrase);
}

/** What JAX or PyTorch was told (`told: …`), or what its import will bring (`at its import: …`). */
function frameworkTold(trans: TranslationBundle, name: 'jax' | 'torch', framework: IFramework, growth: boolean): string {
  const variables = framework.variables.map(variable => `${variable.name}=${variable.value}`).join(', ');
  const parts = variables ? [variables] : [];
  if (name === 'torch') {
    const fractions = torchFractions(trans, framework);
    parts.push(...(fractions === null ? [] : [fractions]));
    if (growth) {
      parts.push(trans.__('growth: nothing to do (its caching allocator never preallocates)'));
    }
  }
  const told = parts.join('; ');
  if (!told) {
    return name === 'jax' ? trans.__('told nothing (its default: 75% of each GPU at its first op)') : trans.__('told nothing');
  }
  return framework.state === 'not_imported' ? trans.__('at its import: %1', told) : trans.__('told: %1', told);
}

/** Keras's backend and where it comes from: `backend jax (KERAS_BACKEND)`. */
function kerasLine(trans: TranslationBundle, keras: NonNullable<IFrameworks['keras']>): string {
  const sources: Record<typeof keras.source, string> = {
    keras: trans.__('as imported'),
    default: trans.__('its default'),
    KERAS_BACKEND: 'KERAS_BACKEND',
    'keras.json': 'keras.json'
  };
  return trans.__('backend %1 (%2)', keras.backend, sources[keras.source]);
}

/** Each other framework present in the kernel, as the status says it (`_framework_line`): `0.10.2,
 * backends started: …; told: XLA_PYTHON_CLIENT_PREALLOCATE=false`; none for a TensorFlow-only kernel.
 * `growth`: the policy asks for memory growth (PyTorch has nothing to do for it). */
export function frameworkRows(trans: TranslationBundle, frameworks: IFrameworks | null, growth: boolean): IFrameworkRow[] {
  const rows: IFrameworkRow[] = [];
  for (const name of ['jax', 'torch'] as const) {
    const framework = frameworks?.[name] ?? null;
    if (framework !== null) {
      const life = [framework.version ?? '', frameworkState(trans, name, framework.state)].filter(part => part);
      const line = `${life.join(', ')}; ${frameworkTold(trans, name, framework, growth)}`;
      rows.push({ name, label: FRAMEWORK_LABELS[name], line });
    }
  }
  if (frameworks?.keras) {
    rows.push({ name: 'keras', label: FRAMEWORK_LABELS.keras, line: kerasLine(trans, frameworks.keras) });
  }
  return rows;
}

/** One device's own figures of a framework, as `%tfgpu memory` says them (`framework_lines`): `JAX
 * gpu:0: in use 1.2 GiB, peak 2.0 GiB, pool limit 60.0 GiB`, with its card cut short where `withCard`
 * (`JAX gpu:0 (GPU-b1c2d3e4…): …`). */
export function frameworkMemoryLine(
  trans: TranslationBundle,
  name: 'jax' | 'torch',
  row: IFrameworkMemory,
  withCard: boolean
): string {
  const parts =
    name === 'jax'
      ? [
          trans.__('in use %1', bytesText(row.current)),
          ...(row.peak === null ? [] : [trans.__('peak %1', bytesText(row.peak))]),
          ...(row.reserved === null ? [] : [trans.__('pool limit %1', bytesText(row.reserved))])
        ]
      : [
          trans.__('allocated %1', bytesText(row.current)),
          ...(row.reserved === null ? [] : [trans.__('reserved %1', bytesText(row.reserved))])
        ];
  const where = withCard && row.card ? ` (${shortUuid(row.card)})` : '';
  return trans.__('%1 %2%3: %4', FRAMEWORK_LABELS[name], row.device, where, parts.join(', '));
}

/** Each device's own figures of JAX and PyTorch, with the framework they are of. */
export function frameworkMemory(
  frameworks: IFrameworks | null
): { name: 'jax' | 'torch'; row: IFrameworkMemory }[] {
  return (['jax', 'torch'] as const).flatMap(name => (frameworks?.[name]?.memory ?? []).map(row => ({ name, row })));
}

export { errorShort, errorText };

/** What a failure is worded from: how it failed, the HTTP status, the code of the server's error body. */
type FailureFacts<K extends FailureKind = FailureKind> = Pick<RequestFailure, 'status' | 'code'> & { kind: K };

/** What a failed request means, and its fix. A refusal is worded by its error body's `code` (a 403 is
 * `forbidden` because the body says so); its HTTP status only where the body was not the schema's error (a
 * proxy's page, an empty body). */
export function failureText(trans: TranslationBundle, { kind, status, code }: FailureFacts): IProblemText {
  switch (kind) {
    case 'extension-missing':
      return {
        what: trans.__('The tfgpu_magic server extension is off or not installed: no GPU figures.'),
        fix: trans.__('Run jupyter server extension enable %1, then restart JupyterLab.', SERVER_EXTENSION)
      };
    case 'server-gone':
      return {
        what: trans.__('The Jupyter server does not answer.'),
        fix: trans.__('Check that JupyterLab still runs (its terminal shows why it stopped), then reload this page.')
      };
    case 'failed':
      return code !== null
        ? errorText(trans, code)
        : {
            what: trans.__('The GPU request failed (HTTP %1).', status ?? '?'),
            fix: trans.__("The Jupyter server's log says why.")
          };
    case 'unknown-kernel':
      return {
        what: trans.__('The server extension does not know this kernel yet.'),
        fix: ''
      };
    case 'server-older':
      return {
        what: trans.__("The tfgpu_magic server extension is older than this page's extension: no GPU figures."),
        fix: trans.__("Install the same tfgpu_magic in the Jupyter server's environment, then restart JupyterLab.")
      };
    case 'browser-older':
      return {
        what: trans.__("This page's tfgpu_magic extension is older than the server extension: no GPU figures."),
        fix: trans.__('Reload this page (JupyterLab loads the newer extension), or restart JupyterLab.')
      };
  }
}

/** A failed request in a few words, for the status bar where there is nothing else to show (by its code, as
 * `failureText`). */
export function failureShort(
  trans: TranslationBundle,
  { kind, status, code }: FailureFacts<Exclude<FailureKind, 'unknown-kernel'>>
): string {
  switch (kind) {
    case 'extension-missing':
      return trans.__('GPU: server extension off');
    case 'server-gone':
      return trans.__('GPU: server not answering');
    case 'failed':
      return code !== null ? trans.__('GPU: %1', errorShort(trans, code)) : trans.__('GPU: request failed (HTTP %1)', status ?? '?');
    case 'server-older':
      return trans.__('GPU: server extension older than the page');
    case 'browser-older':
      return trans.__('GPU: page older than the server extension');
  }
}

/** The server runs in a pid namespace of its own: NVML's pids are the host's. */
export function hostPidsText(trans: TranslationBundle): IProblemText {
  return {
    what: trans.__(
      "The Jupyter server runs in a container whose process ids are not the host's: processes on the GPUs are not matched to notebooks."
    ),
    fix: trans.__('Start the container with docker run --pid=host (hostPID: true in Kubernetes).')
  };
}

/** `42 s`, `5 min`, `3 h`: how old something is. */
export function age(trans: TranslationBundle, seconds: number): string {
  const whole = Math.max(0, Math.floor(seconds));
  if (whole < 90) {
    return trans.__('%1 s', whole);
  }
  if (whole < 90 * 60) {
    return trans.__('%1 min', Math.round(whole / 60));
  }
  return trans.__('%1 h', Math.round(whole / 3600));
}

/** A memory chart's text equivalent: `last 12 min: peak 5.9 GiB during cell [3]; now 2.9 GiB`. */
export function historyText(trans: TranslationBundle, seconds: number, peak: IPoint, now: IPoint): string {
  const during = peak.cell === null ? trans.__('outside any cell') : trans.__('during cell [%1]', peak.cell);
  return trans.__('last %1: peak %2 %3; now %4', age(trans, seconds), bytesText(peak.bytes), during, bytesText(now.bytes));
}

/** One point of a memory chart: `14:02:31 · 3.1 GiB · cell [4]`. */
export function historyPoint(trans: TranslationBundle, point: IPoint): string {
  const cell = point.cell === null ? trans.__('no cell running') : trans.__('cell [%1]', point.cell);
  return [new Date(point.time * 1000).toLocaleTimeString(), bytesText(point.bytes), cell].join(' · ');
}

/** What a chart's dashed line is: `dashed: TensorFlow's own figure (its tensors)`. */
export function historyOwn(trans: TranslationBundle, source: FrameworkSource): string {
  const name = source === 'tensorflow' ? 'TensorFlow' : FRAMEWORK_LABELS[source];
  return trans.__("dashed: %1's own figure (its tensors)", name);
}

/** `stale: 42 s old`. */
export function staleText(trans: TranslationBundle, seconds: number): string {
  return trans.__('stale: %1 old', age(trans, seconds));
}

/** `idle 42s`, `idle 5m`, `idle 2h05m` (as `%tfgpu who` says it); '' when unknown. */
export function idle(trans: TranslationBundle, seconds: number | null): string {
  if (seconds === null) {
    return '';
  }
  if (seconds < 60) {
    return trans.__('idle %1s', Math.floor(seconds));
  }
  if (seconds < 3600) {
    return trans.__('idle %1m', Math.floor(seconds / 60));
  }
  const minutes = String(Math.floor((seconds % 3600) / 60)).padStart(2, '0');
  return trans.__('idle %1h%2m', Math.floor(seconds / 3600), minutes);
}

/** Which cards the kernel's status names: `GPU 0,1`, `all GPUs`, `no GPU`, `GPU ?`. */
function gpuLabel(trans: TranslationBundle, reply: IKernelReply): string {
  if (reply.gpus.length === 0) {
    return reply.gpu_status.error && reply.gpus_from !== 'policy' ? trans.__('GPU ?') : trans.__('no GPU');
  }
  if (reply.gpus_from === 'all' && reply.gpus.length > 1) {
    return trans.__('all GPUs');
  }
  return trans.__('GPU %1', reply.gpus.map(gpu => gpu.index).join(','));
}

/** TensorFlow's state in the kernel: from its own record, else from its process (`kernelRef`). */
function kernelTensorflow(reply: IKernelReply): TensorFlowState | null {
  return reply.tensorflow?.state ?? reply.kernel.tensorflow;
}

/** The kernel in one line: `GPU 1 · growth on · 2.0 / 80 GiB · TF initialized · restart pending`. */
export function statusLine(trans: TranslationBundle, reply: IKernelReply): string {
  const parts = [gpuLabel(trans, reply)];
  if (!reply.published || reply.policy === null) {
    parts.push(trans.__('tfgpu not loaded'));
  } else {
    const settings = policySettings(trans, reply.policy);
    parts.push(settings.length ? settings.join(', ') : trans.__('no policy'));
  }
  const total = reply.gpus.reduce((sum, gpu) => sum + (gpu.memory_total ?? 0), 0);
  if (total > 0) {
    parts.push(gibPair(reply.gpus.reduce((sum, gpu) => sum + (gpu.kernel_memory ?? 0), 0), total));
  }
  const tf = kernelTensorflow(reply);
  parts.push(tf ? trans.__('TF %1', tensorflowState(trans, tf)) : trans.__('TF ?'));
  if (reply.restart_needed) {
    parts.push(trans.__('restart pending'));
  }
  return parts.join(' · ');
}

/** The kernel in full, for a tooltip: TensorFlow's state and who initialized it, the other frameworks,
 * the policy, what waits, what its tensors hold and the other frameworks' own figures (errors are
 * `problems.ts`'s). */
export function statusDetails(trans: TranslationBundle, reply: IKernelReply): string[] {
  const lines: string[] = [];
  const tf = kernelTensorflow(reply);
  if (tf) {
    const by = reply.tensorflow?.initialized_by;
    const state = tensorflowState(trans, tf);
    lines.push(trans.__('TensorFlow: %1', by ? `${state} ${initializedBy(trans, by)}` : state));
  }
  for (const row of frameworkRows(trans, reply.frameworks, reply.policy?.growth === true)) {
    lines.push(`${row.label}: ${row.line}`);
  }
  if (reply.policy) {
    const phrases = policyPhrases(trans, reply.policy);
    lines.push(trans.__('Policy: %1', phrases.length ? phrases.join(', ') : trans.__("TensorFlow's defaults")));
  }
  for (const group of pendingGroups(trans, reply.pending)) {
    lines.push(`${group.title}:`, ...group.items.map(item => `  - ${item}`));
  }
  if (reply.tensorflow?.memory.length) {
    const held = reply.tensorflow.memory.map(row =>
      trans.__('%1: %2 (peak %3)', row.device, bytesText(row.current), bytesText(row.peak))
    );
    lines.push(trans.__("TensorFlow's tensors: %1", held.join(', ')));
  }
  lines.push(...frameworkMemory(reply.frameworks).map(({ name, row }) => frameworkMemoryLine(trans, name, row, true)));
  return lines;
}
