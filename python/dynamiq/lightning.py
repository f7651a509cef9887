"""dynamiq under PyTorch Lightning (`lightning.pytorch`; tested with lightning 2.6.6).

    state = dynamiq.HookState(dynamiq.Config(mode="dynamiq", bits=5.0))
    trainer = lightning.pytorch.Trainer(
        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=dynamiq.comm_hook),
        callbacks=[dynamiq.lightning.DynamiqCallback()], ...)

`DDPStrategy` registers a comm hook on CUDA devices only (lightning 2.6.6,
`DDPStrategy._register_ddp_hooks`); on CPU (Gloo) it leaves the model without
it and DDP all-reduces uncompressed. `DynamiqCallback` registers the strategy's
hook where Lightning did not, saves the `HookState` in Lightning's checkpoints
and restores it on resume (`trainer.fit(..., ckpt_path=...)`), and logs
`state.scalars()` through the module's loggers (TensorBoard, CSV, ...).

This module imports lightning; `import dynamiq` does not import it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel

from .api import DynamiqError
from .hook import HookState, comm_hook


class DynamiqCallback(pl.Callback):
    """Makes `DDPStrategy(ddp_comm_state=HookState(...), ddp_comm_hook=dynamiq.comm_hook)`
    work on every device and carries the hook's state through checkpoints.

    Args:
      log_every_n_steps: log `state.scalars()` (names `dynamiq/...`) with
        `pl_module.log_dict` every this many optimizer steps (0: never).
      print_every_n_steps: print `state.summary()` on global rank 0 every this many
        steps (0: never).
    """

    def __init__(self, log_every_n_steps: int = 1, print_every_n_steps: int = 0) -> None:
        self.log_every_n_steps = int(log_every_n_steps)
        self.print_every_n_steps = int(print_every_n_steps)
        self.state: Optional[HookState] = None
        self._pending: Optional[Dict[str, Any]] = None  # a checkpoint's state loaded before the state is found
        self._reported = -1  # the last step logged (several batches make one step with gradient accumulation)

    # -- finding (and on CPU registering) the hook ----------------------------------------
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        strategy = trainer.strategy
        model = getattr(strategy, "model", None)
        if not isinstance(model, DistributedDataParallel):
            raise DynamiqError("dynamiq.lightning.DynamiqCallback: the strategy's model is not a "
                               f"DistributedDataParallel model ({type(model).__name__}); use DDPStrategy")
        hooks = list(getattr(model, "_comm_hooks", ()))
        state = next((st for h, st in hooks if h is comm_hook), None)
        if state is None:
            hook, st = getattr(strategy, "_ddp_comm_hook", None), getattr(strategy, "_ddp_comm_state", None)
            if hook is not comm_hook or not isinstance(st, HookState):
                raise DynamiqError("dynamiq.lightning.DynamiqCallback: the strategy has no dynamiq hook; make it "
                                   "with DDPStrategy(ddp_comm_state=dynamiq.HookState(config), "
                                   "ddp_comm_hook=dynamiq.comm_hook)")
            if hooks:
                raise DynamiqError("dynamiq.lightning.DynamiqCallback: the DDP model has another comm hook "
                                   f"({hooks[0][0].__qualname__})")
            # Lightning registers the hook on CUDA only: here (CPU) it did not
            model.register_comm_hook(st, comm_hook)
            state = st
        if not isinstance(state, HookState):
            raise DynamiqError("dynamiq.lightning.DynamiqCallback: dynamiq.comm_hook is registered with a "
                               f"{type(state).__name__} as its state, not a dynamiq.HookState")
        self.state = state
        if self._pending is not None:  # resuming: the checkpoint's state, before the first bucket
            state.load_state_dict(self._pending)
            self._pending = None

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"hook_state": self.state.state_dict()} if self.state is not None else {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        # called before on_fit_start (the model is wrapped in DDP in between)
        sd = state_dict.get("hook_state")
        if sd is None:
            return
        if self.state is not None:
            self.state.load_state_dict(sd)
        else:
            self._pending = sd

    # -- logging ---------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        st = self.state
        if st is None or not st.last_step_stats or st.step == self._reported:
            return
        self._reported = st.step
        if self.log_every_n_steps and st.step % self.log_every_n_steps == 0:
            # this rank's numbers (every rank sends about as much); not reduced over ranks
            pl_module.log_dict(st.scalars(), on_step=True, on_epoch=False, sync_dist=False, rank_zero_only=True)
        if self.print_every_n_steps and st.step % self.print_every_n_steps == 0 and trainer.is_global_zero:
            print(st.summary(), flush=True)
