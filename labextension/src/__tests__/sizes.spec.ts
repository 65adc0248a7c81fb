/**
 * sizes.ts writes sizes as tfgpu_magic/language/sizes.py does; each expected string below is what the
 * Python function returns for the same bytes (`bytes_text`, `gib_pair`, `directive_size`, `split_size`).
 */
import { MIB, bytesText, directiveSize, gibPair, splitSize } from '../sizes';

const GIB = 1024 * MIB;

describe('bytesText', () => {
  it.each([
    [null, '?'],
    [undefined, '?'],
    [0, '0 MiB'],
    [MIB / 2, '0 MiB'], // half a MiB: a tie, rounded to the even 0
    [MIB / 2 + 1, '1 MiB'],
    [512 * MIB, '512 MiB'],
    [1023 * MIB, '1023 MiB'],
    [1023.5 * MIB, '1.0 GiB'], // rounds to 1024 MiB: written in GiB
    [GIB, '1.0 GiB'],
    [1.25 * GIB, '1.2 GiB'], // Python's round-half-even, where toFixed would write 1.3
    [2.25 * GIB, '2.2 GiB'],
    [2.5 * GIB, '2.5 GiB'],
    [3.5 * GIB, '3.5 GiB'],
    [1024 * GIB, '1.0 TiB'],
    [1023 * GIB + 600 * MIB, '1.0 TiB']
  ])('%p bytes read %p', (bytes, text) => {
    expect(bytesText(bytes as number | null | undefined)).toBe(text);
  });
});

describe('gibPair', () => {
  it.each([
    [20 * GIB, 80 * GIB, '20.0 / 80 GiB'],
    [0, 40 * GIB, '0.0 / 40 GiB'],
    [2304 * MIB, 40448 * MIB, '2.2 / 39.5 GiB'],
    [1536 * MIB, 81559 * MIB, '1.5 / 79.6 GiB'],
    [100 * MIB, 512 * MIB, '100 / 512 MiB'],
    [null, 80 * GIB, '? / 80.0 GiB']
  ])('%p of %p reads %p', (used, total, text) => {
    expect(gibPair(used, total)).toBe(text);
  });
});

describe('directive sizes', () => {
  it('writes whole GiB as GB, else MB', () => {
    expect(directiveSize(2 * GIB)).toBe('2GB');
    expect(directiveSize(512 * MIB)).toBe('512MB');
    expect(directiveSize(1536 * MIB)).toBe('1536MB');
  });

  it('writes equal parts as NxSIZE, others as a list', () => {
    expect(splitSize([GIB, GIB])).toBe('2x1GB');
    expect(splitSize([GIB, 3 * GIB])).toBe('1GB,3GB');
    expect(splitSize([512 * MIB])).toBe('1x512MB');
  });
});
