"""torch.distributed in a %%horovod cell: the environment torchrun gives (env://), real ranks."""

import pytest

import hvd_magic

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("line", ["--np -2", "--np 2"])  # on the driver; on Spark local
def test_init_process_group_with_no_argument(ip, line):
    cell = ("import os\n"
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "x = torch.tensor([float(dist.get_rank() + 1)])\n"
            "dist.all_reduce(x)\n"
            "env = {k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'GROUP_RANK',\n"
            "                                   'LOCAL_WORLD_SIZE', 'TORCHELASTIC_USE_AGENT_STORE')}\n"
            "assert env['RANK'] == env['LOCAL_RANK'] == str(dist.get_rank()), env\n"
            "dist.destroy_process_group()\n"
            "(x.item(), env)\n")
    total, env = ip.run_cell_magic("horovod", line, cell)  # rank 0's value
    assert total == 3.0  # 1 + 2: both ranks met in one process group
    assert env == {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                   "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "False"}


def test_a_rank_that_raises_ends_the_others_blocked_in_a_collective(ip):
    cell = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "if dist.get_rank() == 1:\n"
            "    raise ValueError('rank one gives up')\n"
            "dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes\n")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --timeout 120", cell)
    assert info.value.rank == 1
    assert "rank one gives up" in "\n".join(info.value._render_traceback_())
    assert hvd_magic.last_run().state == "failed"  # not the 120 s timeout, nor Gloo's 30 min
