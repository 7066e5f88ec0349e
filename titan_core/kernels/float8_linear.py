"""torchao's Float8Linear whose matmuls follow its weights' device (imports torchao; see float8.py).

A swap builds the module on the meta device, before the run's device is known, so torchao's
`emulate` flag (fixed at construction) cannot be chosen there. The module chooses when its
weights land on a device (`to_empty`, `.to`): torch._scaled_mm on a CUDA GPU of compute
capability 8.9+, torchao's emulation on CPU, a KernelUnavailable elsewhere, which stops the run
while the model is built rather than at its first step.
"""

from __future__ import annotations

import dataclasses

import torch

from titan_core.models.common.mapping_errors import KernelUnavailable
from titan_core.runtime.quiet import TORCHAO_IMPORT, quiet_loggers

MIN_CUDA_CAPABILITY = (8, 9)
"""torch._scaled_mm's float8 matmuls: Ada (8.9), Hopper (9.0), Blackwell (10.0, 12.0)."""


with quiet_loggers(*TORCHAO_IMPORT):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear


def emulate_on(device: torch.device, recipe: str) -> bool:
    """Whether float8 matmuls on `device` are torchao's emulation (True) or torch._scaled_mm (False);
    raises KernelUnavailable where neither runs."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        if torch.version.hip:  # ROCm's float8 (MI300+): torch._scaled_mm checks the GPU itself
            return False
        cap = torch.cuda.get_device_capability(device)
        if cap < MIN_CUDA_CAPABILITY:
            raise KernelUnavailable(
                f"kernels.float8={recipe} needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, "
                f"Blackwell) for torch._scaled_mm; {torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}; "
                f"set kernels.float8 = none"
            )
        return False
    raise KernelUnavailable(
        f"kernels.float8={recipe} is not available on {device.type}: torchao's float8 training runs "
        f"torch._scaled_mm on CUDA (compute capability 8.9+) or emulates it on CPU; set kernels.float8 = none"
    )


class Float8TrainingLinear(Float8Linear):
    """Float8Linear built from an nn.Linear (same parameter objects and names), emulated or not by device."""

    recipe: str = ""

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: str) -> Float8TrainingLinear:
        new = cls.from_float(linear, config=Float8LinearConfig.from_recipe_name(recipe))
        new.recipe = recipe
        new._follow(new.weight.device)
        return new

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._follow(self.weight.device)
        return self

    def _follow(self, device: torch.device) -> None:
        if device.type == "meta":
            return
        emulate = emulate_on(device, self.recipe)
        if emulate == self.config.emulate:
            return
        self.config = dataclasses.replace(self.config, emulate=emulate)
        # the three matmuls' settings, as Float8Linear's constructor built them, with the new flag
        mm = self.linear_mm_config
        self.linear_mm_config = type(mm)(*(c._replace(emulate=emulate) for c in mm))

    @property
    def emulated(self) -> bool:
        """The matmuls are torchao's emulation (CPU) rather than torch._scaled_mm."""
        return self.config.emulate

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}, emulate={self.config.emulate}"
