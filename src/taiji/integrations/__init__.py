"""Entry points for training loops a framework owns: PyTorch Lightning (``taiji.integrations.lightning``)
and the Hugging Face Trainer (``taiji.integrations.transformers``).

Both drive a ``taiji.Job`` one step at a time (``loop.FrameworkLoop``): the framework keeps its loop,
its hooks and its logging; the Job decides what each step trains on, runs the step's collectives,
commits or retries it, and applies the policies at each boundary. Nothing here imports a framework
until its subpackage is imported.
"""
