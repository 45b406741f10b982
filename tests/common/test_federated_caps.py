"""A federated device's cap by round: its cap, then its schedule's steps."""

import pytest
from pydantic import ValidationError

from edgetrain.common.federated.spec import FederatedDevice


def test_a_cap_schedule_by_round_holds_from_each_steps_round_on() -> None:
    device = FederatedDevice(device_id="nano-1", power_cap_w=5.0, power_cap_schedule=[(3, 4.0), (6, None)])
    assert [device.cap_in(r) for r in range(1, 8)] == [5.0, 5.0, 4.0, 4.0, 4.0, None, None]
    assert FederatedDevice(device_id="nano-1").cap_in(1) is None


@pytest.mark.parametrize("schedule", [[(3, 4.0), (2, 5.0)], [(1, -1.0)]])
def test_a_schedule_out_of_order_or_with_a_cap_below_zero_is_refused(schedule) -> None:
    with pytest.raises(ValidationError, match="power_cap_schedule"):
        FederatedDevice(device_id="nano-1", power_cap_schedule=schedule)
