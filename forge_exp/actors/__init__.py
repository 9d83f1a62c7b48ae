"""The Monarch actors that host the services (one module per service).

Actors colocated on one process (services' `mesh: host`) are unpickled and built concurrently, and two threads
importing torch's and transformers' model code at once can be handed each other's half-initialised modules
(torch._dynamo imports itself in a cycle). So the first actor to arrive imports that code here, under this package's
import lock, before any actor module loads.
"""

import transformers.modeling_utils  # noqa: F401
