"""A batch's arrays as tensors on a device: what every built-in trainer's ``step`` starts with.

The trainer worker may have put the batch on the device already (its ``to_device`` stage, see
``api.trainer.Trainer.accepts_device_batches``): tensors pass through, arrays are converted
(sharing memory on the CPU).
"""

from __future__ import annotations

import numpy as np
import torch

from api.namedarray import NamedArray


def on_device(samples: NamedArray, device: torch.device) -> NamedArray:
    return samples.apply(lambda x: _tensor(x, device))


def _tensor(value, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.as_tensor(np.asarray(value), device=device)
