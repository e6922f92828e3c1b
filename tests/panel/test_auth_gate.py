"""The sign-in gate's parts without a server: the throttle's arithmetic and the password check."""

from __future__ import annotations

import statistics
import time

from tunedeck.app.auth_gate import LoginThrottle, password_checker


class SteppedClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_client_gets_five_tries_a_minute_and_then_waits():
    clock = SteppedClock()
    throttle = LoginThrottle(per_client=5, overall=20, window_s=60, clock=clock)
    for _ in range(5):
        assert throttle.begin("10.0.0.1") == 0
        clock.now += 1
    assert throttle.begin("10.0.0.1") == 55  # the first failure leaves the window in 55 s
    assert throttle.begin("10.0.0.2") == 0  # another client is not held up
    clock.now += 55
    assert throttle.begin("10.0.0.1") == 0


def test_a_swarm_gets_one_try_per_address_and_never_locks_out_a_client_that_has_not_failed():
    clock = SteppedClock()
    throttle = LoginThrottle(per_client=5, overall=20, window_s=60, clock=clock)
    for n in range(20):
        assert throttle.begin(f"10.0.1.{n}") == 0
    assert throttle.begin("10.0.1.0") == 60  # the window is crowded: an address that failed waits
    assert throttle.begin("10.0.2.1") == 0  # one that has not is still checked (the right password gets in)
    assert throttle.begin("10.0.2.1") == 60  # once
    clock.now += 60
    assert throttle.begin("10.0.1.0") == 0


def test_a_success_forgets_the_clients_failures():
    throttle = LoginThrottle(per_client=2, overall=20, window_s=60, clock=SteppedClock())
    assert throttle.begin("a") == 0 and throttle.begin("a") == 0
    throttle.succeeded("a")
    assert throttle.begin("a") == 0


def test_password_check_accepts_only_a_known_pair():
    check = password_checker([("ann", "s3cret"), ("bob", "pa:ss")])
    assert check("ann", "s3cret") and check("bob", "pa:ss")
    assert not check("ann", "pa:ss") and not check("bob", "s3cret") and not check("eve", "s3cret")
    assert not check("ann", "s3cret ") and not check("", "")


def test_password_check_takes_as_long_for_an_unknown_user_as_for_a_wrong_password():
    """Measured: Gradio's own check (`user in table and compare_digest(...)`) answers an unknown
    user in 42 ns and a wrong password in 139 ns here, which tells a guesser which users exist."""
    check = password_checker([("ann", "a-long-enough-password"), ("bob", "another-password")])
    cases = {"unknown user": ("zed", "x"), "wrong password": ("ann", "y"), "right": ("ann", "a-long-enough-password")}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(25):  # interleaved, so a busy neighbour slows every case alike
        for name, (user, password) in cases.items():
            started = time.perf_counter()
            for _ in range(2000):
                check(user, password)
            samples[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    print({name: f"{1e9 * t / 2000:.0f} ns" for name, t in medians.items()})
    # The leak this guards against was 3.3x; 1.5 leaves room for a machine loaded by other work.
    assert max(medians.values()) / min(medians.values()) < 1.5, medians
