"""The node size a command's cluster takes when `--gpus-per-node` is left out.

A node only matters where something is placed by node: node limits (`--groups`: each expert group within
`--nodes-per-group` nodes, or DeepSeek's hierarchical greedy), and what is reported per node (cross-node moves of
`--current`, the `node_step` metric). A placement without node limits is the same whatever the node size, so it
never asks the GPUs to fill whole 8-GPU servers:

- `--current` names the placement now serving, on as many GPUs: its node size (the cluster it serves on);
- `--gpus` fills whole 8-GPU servers (or is at most 8): nodes of 8, an HGX server, as before;
- else, with `--trtllm-out` and `--gpus` a multiple of 4: nodes of 4, a GB200 NVL72 compute tray, the hardware
  TensorRT-LLM's published EP36 layout (36 ranks x 8 slots) runs on;
- else, without node limits: the group as one node (no node structure is known, and none is used);
- else (node limits asked for, no node size known): refused in one line naming `--gpus-per-node`.
"""

import argparse

from placement import ClusterSpec
from traces import EplbError

SERVER_GPUS = 8  # an HGX server's GPUs: the node size wherever --gpus fills whole servers
GB200_TRAY_GPUS = 4  # a GB200 NVL72 compute tray's GPUs: TensorRT-LLM's EP36 runs on 9 of the rack's 18 trays


def gpus_per_node(args: argparse.Namespace, serving: ClusterSpec | None = None) -> int:
    """`--gpus-per-node` when given, else the node size of the module docstring for `--gpus` (`serving`: the
    cluster of `--current`'s placement, if any).

    Raises:
        EplbError: node limits (`--groups`) are asked for, `--gpus` does not fill whole 8-GPU servers and no engine
            layout says the node size (one line naming `--gpus-per-node`).
    """
    if args.gpus_per_node is not None:
        return args.gpus_per_node
    gpus = args.gpus
    if serving is not None and serving.num_gpus == gpus:
        return serving.gpus_per_node
    if gpus <= SERVER_GPUS or gpus % SERVER_GPUS == 0:
        return SERVER_GPUS
    if getattr(args, "trtllm_out", None) and gpus % GB200_TRAY_GPUS == 0:
        return GB200_TRAY_GPUS
    if getattr(args, "groups", None) is not None:
        whole = -(-gpus // SERVER_GPUS) * SERVER_GPUS
        raise EplbError(f"--groups places expert groups on nodes, and --gpus={gpus} does not fill whole 8-GPU nodes; "
                        f"give --gpus-per-node (the GPUs of one server, dividing {gpus}: 4 for GB200 NVL72 trays), "
                        f"use --gpus={whole}, or drop --groups")
    return gpus
