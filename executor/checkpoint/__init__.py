"""Checkpoints in torch.distributed.checkpoint (DCP) format.

A checkpoint of iteration i is a directory:
    iter000003/stage0/      one DCP checkpoint per stage: {"model": ..., "optim": ...}
    iter000003/stage1/      as torch.distributed.checkpoint.state_dict.get_state_dict gives
    iter000003/recycle.json the manifest (grid, model config, losses 0..i, its parts), last
Under a cut of the job's stages (a change of shape) the parts are those of the cut:
    iter000007/shape1-0a1b2c3d/stage0/
Parameter names are the unsplit model's in every split, so any stage of any shape loads
from any checkpoint by name (stage_state.load_by_name): a run resumes on another grid.
A pipeline stage's state is the same on every replica, so one worker per stage (its
writer) saves it; the coordinator writes the manifest once every stage's part and every
loss up to i is in, and that makes the checkpoint complete. Each part loads with DCP's
own tools (`dcp.load`, `format_utils.dcp_to_torch_save`), without this project.
"""
from executor.checkpoint.manifest import (FORMAT, CheckpointError, Manifest, newest,
                                          read_checkpoint)
from executor.checkpoint.stage_state import (load_by_name, load_stage, save_stage, save_state,
                                             stage_state)
from executor.checkpoint.store import CheckpointStore

__all__ = ["FORMAT", "CheckpointError", "CheckpointStore", "Manifest", "load_by_name", "load_stage",
           "newest", "read_checkpoint", "save_stage", "save_state", "stage_state"]
