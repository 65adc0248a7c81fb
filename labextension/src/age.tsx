/**
 * The age of stale figures, counting on between polls (a failing server is asked seldom).
 */
import type { TranslationBundle } from '@jupyterlab/translation';
import React, { useEffect, useState } from 'react';

import type { IGpuStatus } from './api';
import type { IReceived } from './model';
import { staleSeconds } from './problems';
import { staleText } from './words';

/** `stale: 42 s old` (after `prefix`) while `received` is not current (`staleSeconds`), nothing while it
 * is; rendered again every second while shown. */
export function StaleMark(props: {
  trans: TranslationBundle;
  received: IReceived<{ gpu_status: IGpuStatus }> | null;
  failing: boolean;
  prefix?: string;
}): JSX.Element | null {
  const [, setTicks] = useState(0); // only to render again: the age is read from the clock
  const seconds = staleSeconds(props.received, props.failing, Date.now());
  const stale = seconds !== null;
  useEffect(() => {
    if (!stale) {
      return undefined;
    }
    const timer = window.setInterval(() => setTicks(ticks => ticks + 1), 1000);
    return (): void => window.clearInterval(timer);
  }, [stale]);
  if (seconds === null) {
    return null;
  }
  return (
    <>
      {props.prefix}
      <span className="tfgpu-stale">{staleText(props.trans, seconds)}</span>
    </>
  );
}
