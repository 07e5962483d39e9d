"""A mid-epoch state read as a state between epochs (``checkpoint.epoch_over``: Lightning's
checkpoint at a limited epoch's last batch): what the next epoch starts from."""

import torch

from headrace.runtime.bitmap import Bitmap
from headrace.runtime.checkpoint import ResumePoint, epoch_over


def test_the_next_epoch_keeps_the_step_order_and_autoorders_phase_the_saved_epoch_ran():
    delivered = Bitmap()
    delivered.set(0)
    point = ResumePoint(epoch=3, in_epoch=True, origin=None, delivered=delivered,
                        generator_state=torch.Generator().get_state(), persistent_base_seed=7,
                        steps=("crop", "flip", "normalize"), order_phase="validating",
                        empty_batches=1, batches=5)
    over = epoch_over(point)
    assert (over.epoch, over.in_epoch, over.origin) == (4, False, None)
    assert (over.empty_batches, over.batches, over.delivered.end()) == (0, 0, 0)
    # the order that epoch ran, and the phase AutoOrder was in with it, carry to the next
    assert over.steps == ("crop", "flip", "normalize") and over.order_phase == "validating"
    assert over.persistent_base_seed == 7
