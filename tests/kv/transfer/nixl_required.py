"""The NIXL transport's tests need the `nixl` package; without it they skip, saying so."""

import pytest

from stator.kv.transfer import nixl

NOT_INSTALLED = (
    "NIXL TRANSPORT NOT TESTED: the nixl package is not installed "
    "(pip install 'stator[nixl]', as .ci/run does)"
)
needs_nixl = pytest.mark.skipif(not nixl.available(), reason=NOT_INSTALLED)
