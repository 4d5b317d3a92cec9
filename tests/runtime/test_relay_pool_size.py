"""FutureMap's pool size is a whole number of slots: no silent truncation (issue 15 section 5)."""

from __future__ import annotations

import pytest

from relayc.generated import none
from relayc.runtime.relay import RelayError


@pytest.mark.parametrize("size", [2.7, 4.0, "16", True, None])
def test_a_pool_size_that_is_not_a_whole_number_is_a_relay_error(size: object) -> None:
    with pytest.raises(RelayError, match="req_pool_size must be a whole number"):
        none.FutureMap(size, "cpu")  # type: ignore[arg-type]


def test_a_pool_without_room_beside_the_padding_slot_is_a_relay_error() -> None:
    with pytest.raises(RelayError, match="slot 0 is the padding slot"):
        none.FutureMap(1, "cpu")
    assert none.FutureMap(2, "cpu").req_pool_size == 2
