"""``python -m hvd_magic --np 4 train.py args``: the terminal command (`hvd_magic.frontends.terminal`)."""

from .frontends.terminal import run

run()
