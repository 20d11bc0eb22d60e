"""longctx: long-document continued pretraining.

Three parts, installed under this one name: ``longctx.pipeline`` (curation), ``longctx.packer``
(packed shards and the dataloader) and ``longctx.trainer`` (ring attention training), on the shared
ground floor ``longctx.core``. This package itself (the roof) holds the ``longctx`` command
(``longctx.cli``), the run config that assembles the parts' sections (``longctx.config``), the jobs
run from it (``longctx.jobs``) and the demo (``longctx.demo``). Importing it imports none of them.
"""

# In a checkout, the folder ``longctx/`` holds the roof only (the other layers' folders sit beside it). When
# Python is started there with longctx installed (not editable), that folder is found first; extending
# the package path with every other ``longctx`` folder on sys.path lets ``longctx.packer`` and the
# other parts resolve to the installed package all the same.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
