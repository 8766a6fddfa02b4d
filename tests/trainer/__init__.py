"""Tests of the trainer (dgx_trainer) and of `kubedgx run --local`."""
