"""The distributed backends, one module each; a module's name is its backend's name.

Each module is a small policy: the update rule (in its docstring, with the paper), which process
groups it creates, and which shared pieces it composes (:mod:`asrtrain.distributed.allreduce`,
:mod:`asrtrain.distributed.gossip`). A new module here registered with
:func:`asrtrain.distributed.registry.register_backend` is a new ``trainer.backend`` value; nothing
else changes. This file imports nothing: the registry lists the modules without importing torch.
"""
