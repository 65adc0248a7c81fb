/**
 * VDomModel as @jupyterlab/ui-components has it (a `stateChanged` signal, `dispose`), without loading that
 * package's widgets, which need a browser's DOM: a spec that loads model.ts mocks the package with it,
 * `jest.mock('@jupyterlab/ui-components', () => jest.requireActual('./vdommodel'))`.
 */
import { Signal } from '@lumino/signaling';

export class VDomModel {
  readonly stateChanged = new Signal<this, void>(this);
  isDisposed = false;

  dispose(): void {
    this.isDisposed = true;
    Signal.clearData(this);
  }
}
