/**
 * Sizes exactly as the Python side writes them (tfgpu_magic/language/sizes.py: `mib_text`, `bytes_text`,
 * `gib_pair`, `directive_size`, `split_size`), so a size reads the same in the sidebar as in `%tfgpu`:
 * one size is whole MiB under 1 GiB (`512 MiB`), else GiB or TiB with one decimal (`3.5 GiB`); a part
 * of a card is `20.0 / 80 GiB`; a limit or split as the directive writes it (`2GB`, `2x1GB`).
 * tests/test_labextension.py compares the page with the Python functions on the same bytes. Sizes are
 * units, not words: they are not translated.
 */

export const MIB = 1024 * 1024;

/**
 * `value` with `digits` decimals as Python's `f"{value:.{digits}f}"` (and `round`) write it: the exact
 * binary value rounded, a tie to the even digit. (`toFixed` rounds a tie up: `(2.25).toFixed(1)` is
 * `2.3`, Python writes `2.2`.) Sizes here are bytes over powers of two, so `value * 10 ** digits` is exact.
 */
function pyFixed(value: number, digits: number): string {
  const scale = 10 ** digits;
  const scaled = Math.abs(value) * scale;
  const floor = Math.floor(scaled);
  const tie = scaled - floor === 0.5;
  const magnitude = tie ? (floor % 2 === 0 ? floor : floor + 1) / scale : Math.abs(value);
  return (value < 0 ? '-' : '') + magnitude.toFixed(digits);
}

/** MiB as people read it: `512 MiB`, `3.5 GiB`, `1.0 TiB`; `?` when unknown (`mib_text`). */
function mibText(mib: number | null): string {
  if (mib === null) {
    return '?';
  }
  if (Number(pyFixed(Math.abs(mib) / 1024 / 1024, 1)) >= 1) {
    return `${pyFixed(mib / 1024 / 1024, 1)} TiB`;
  }
  return Number(pyFixed(Math.abs(mib), 0)) >= 1024 ? `${pyFixed(mib / 1024, 1)} GiB` : `${pyFixed(mib, 0)} MiB`;
}

/** Bytes as people read them (`mibText`: `0 MiB` below half a MiB); `?` when unknown (`bytes_text`). */
export function bytesText(count: number | null | undefined): string {
  return count === null || count === undefined ? '?' : mibText(count / MIB);
}

/** Used (or free) of a card's total bytes: `20.0 / 80 GiB`, the total whole where it is whole; MiB on both
 * sides on cards under 1 GiB (`100 / 512 MiB`); `?` for what is unknown (`gib_pair` on the MiB counts). */
export function gibPair(usedBytes: number | null, totalBytes: number | null): string {
  const used = usedBytes === null ? null : usedBytes / MIB;
  const total = totalBytes === null ? null : totalBytes / MIB;
  if (used === null || total === null) {
    return `${mibText(used)} / ${mibText(total)}`;
  }
  if (total < 1024) {
    return `${used} / ${total} MiB`;
  }
  const whole = total % 1024 === 0 ? `${total / 1024}` : pyFixed(total / 1024, 1);
  return `${pyFixed(used / 1024, 1)} / ${whole} GiB`;
}

/** A size as a directive writes it: whole GiB as `2GB`, else `512MB` (`directive_size`, on bytes). */
export function directiveSize(bytes: number): string {
  const mib = bytes / MIB;
  return mib % 1024 === 0 ? `${mib / 1024}GB` : `${mib}MB`;
}

/** A split's parts as the directive writes them: `2x1GB` for equal parts, else `1GB,3GB` (`split_size`). */
export function splitSize(parts: number[]): string {
  if (parts.length && parts.every(part => part === parts[0])) {
    return `${parts.length}x${directiveSize(parts[0])}`;
  }
  return parts.map(directiveSize).join(',');
}
