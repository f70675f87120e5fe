"""When free_benchmark leaves out a call of an API it may re-run, and why: reasons that depend on
where the call runs (a compiled graph, an optimizer step, a torch.func transform, distributed
tensors) and on the stage or handler, not on the API. The reasons of the APIs themselves, by name
and by arguments, are the catalogs' (probes/backends/api_exclusions.py). Each is logged once per
API with its reason.
"""

COMPILED = ("compiled MindSpore graph (mindspore.jit or GRAPH_MODE): its calls run inside the graph, where "
            "free_benchmark does not reach (PyNative calls only, as msprobe)")
IN_OPTIMIZER_STEP = ("called inside optimizer.step(): the update is the optimizer's, left out as msprobe leaves out "
                     "fused optimizer kernels (so a model checks the same APIs whether its optimizer runs fused, "
                     "foreach or per tensor)")
TRANSFORM_BACKWARD = ("inside a torch.func transform: the backward stage's hooks need the autograd graph, which "
                      "the transform keeps to itself; the forward stage judges these calls")
TRANSFORM_FIX = ("inside a torch.func transform: fix cannot substitute the values of a transformed tensor; "
                 "check judges these calls")
DISTRIBUTED_FIX = ("distributed tensors (DTensor, a collective's result): fix would substitute values inside a "
                   "sharded tensor on each rank; check judges these calls on the local tensors")
DISTRIBUTED_BACKWARD = ("distributed tensors (DTensor, a collective's result): the backward stage's vector-Jacobian "
                        "products would run on sharded gradients; the forward stage judges these calls on the local "
                        "tensors")
DISTRIBUTED_GRAPH = ("a compiled graph on distributed tensors (DTensor): its compiled code computes the shards and "
                     "their redistributions where DTensor's dispatcher does not show them, so no re-run is known to "
                     "be the same computation")
