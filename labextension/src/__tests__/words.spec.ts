/**
 * words.ts: how failed requests and reply errors read. Each kind of failure has its own sentence and fix;
 * a failed request without an error body names its HTTP status (refusals.spec.ts: one with a body is
 * worded by its code).
 */
import contract from '../../../tfgpu_magic/jupyter/tfgpu-state.schema.json';
import type { ErrorCode, FailureKind } from '../api';
import { age, errorShort, errorText, failureShort, failureText, historyText, staleText } from '../words';
import { trans } from './trans';

const KINDS: FailureKind[] = ['extension-missing', 'server-gone', 'failed', 'unknown-kernel'];

/** A failure of `kind` with `status` and no error body (no code). */
function failed<K extends FailureKind>(kind: K, status: number | null): { kind: K; status: number | null; code: null } {
  return { kind, status, code: null };
}

describe('failureText', () => {
  it('tells how to enable a missing server extension, by its module name', () => {
    const text = failureText(trans, failed('extension-missing', 404));
    expect(text.what).toBe('The tfgpu_magic server extension is off or not installed: no GPU figures.');
    expect(text.fix).toBe('Run jupyter server extension enable tfgpu_magic.serverext, then restart JupyterLab.');
  });

  it('names the HTTP status of a failed request without an error body, or ? without one', () => {
    expect(failureText(trans, failed('failed', 500)).what).toBe('The GPU request failed (HTTP 500).');
    expect(failureText(trans, failed('failed', null)).what).toBe('The GPU request failed (HTTP ?).');
    expect(failureShort(trans, failed('failed', 503))).toBe('GPU: request failed (HTTP 503)');
  });

  it('says a gone server is not answering', () => {
    expect(failureText(trans, failed('server-gone', null)).what).toBe('The Jupyter server does not answer.');
    expect(failureShort(trans, failed('server-gone', null))).toBe('GPU: server not answering');
    expect(failureShort(trans, failed('extension-missing', 404))).toBe('GPU: server extension off');
  });

  it('gives each kind its own sentence, every one filled in (no %1 left)', () => {
    const whats = KINDS.map(kind => failureText(trans, failed(kind, 500)).what);
    expect(new Set(whats).size).toBe(KINDS.length);
    for (const what of whats) {
      expect(what).not.toMatch(/%\d/);
    }
    expect(failureText(trans, failed('unknown-kernel', 404)).fix).toBe('');
  });
});

describe('errorText', () => {
  it('words a state file tfgpu_magic did not write, with its fix', () => {
    expect(errorShort(trans, 'state_invalid')).toBe('state file not ours');
    expect(errorText(trans, 'state_invalid')).toEqual({
      what: "This kernel's tfgpu state file is not one tfgpu_magic wrote: its policy is not shown.",
      fix: 'Restart the kernel; it writes the file anew.'
    });
  });

  it('has a short form, a sentence and a fix for every code the schema lists', () => {
    const codes = contract.$defs.errorCode.enum as ErrorCode[];
    expect(codes).toContain('state_invalid');
    const shorts = codes.map(code => errorShort(trans, code));
    for (const code of codes) {
      const text = errorText(trans, code);
      expect(errorShort(trans, code)).toBeTruthy();
      expect(text.what).toBeTruthy();
      expect(text.fix).toBeDefined();
    }
    expect(new Set(shorts).size).toBe(codes.length);
  });
});

describe('ages', () => {
  it.each([
    [-3, '0 s'],
    [42.9, '42 s'],
    [89, '89 s'],
    [90, '2 min'],
    [89 * 60, '89 min'],
    [90 * 60, '2 h'],
    [5 * 3600, '5 h']
  ])('%p seconds read %p', (seconds, text) => {
    expect(age(trans, seconds)).toBe(text);
  });

  it('marks stale figures with their age', () => {
    expect(staleText(trans, 300)).toBe('stale: 5 min old');
  });
});

describe('historyText', () => {
  it('says the span, the peak with its cell and the latest figure', () => {
    const gib = 1024 ** 3;
    const peak = { time: 100, bytes: 5.9 * gib, cell: 3 };
    const now = { time: 820, bytes: 2.9 * gib, cell: null };
    expect(historyText(trans, 720, peak, now)).toBe('last 12 min: peak 5.9 GiB during cell [3]; now 2.9 GiB');
    expect(historyText(trans, 30, now, now)).toBe('last 30 s: peak 2.9 GiB outside any cell; now 2.9 GiB');
  });
});
