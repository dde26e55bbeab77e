"""KL divergence between the softmax of target logits and of predicted logits, batchmean (loss)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
        log_q = F.log_softmax(pred_logits, dim=-1)
        p = F.softmax(target_logits, dim=-1)
        return F.kl_div(log_q, p, reduction="batchmean")


batch_size = 4096
num_classes = 8192


def get_inputs():
    return [torch.randn(batch_size, num_classes), torch.randn(batch_size, num_classes)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "loss",
    "sizes": {"cpu": {"batch_size": 6, "num_classes": 5000}},
}
