"""The case's dropout as a module, for adapters whose peer takes a dropout nn.Module."""
import torch


class MaskDropout(torch.nn.Module):
    """nn.Dropout's training-mode result for the case's given mask (bool, [tokens, features]):
    the kept elements rescaled by 1 / (1 - p), so that every implementation drops the same."""

    def __init__(self, mask, p):
        super().__init__()
        self.mask, self.p = mask, p

    def forward(self, x):
        return x * self.mask.reshape(x.shape).to(x.dtype) / (1 - self.p)
