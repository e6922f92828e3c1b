"""The sign-in gate's parts without a server: the throttle's arithmetic and the password check."""

from __future__ import annotations

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


def _fastest_per_case(check, cases: dict[str, tuple[str, str]]) -> dict[str, float]:
    """Each case's fastest of 25 interleaved batches: noise (a busy neighbour, a descheduled core) only
    ever adds time, so the fastest batch is the check's own cost; the median is not (CI once saw one
    case 3x faster than the others at the median, on a machine shared with a pytest worker)."""
    fastest = dict.fromkeys(cases, float("inf"))
    for _ in range(25):  # interleaved, so a busy neighbour slows every case alike
        for name, (user, password) in cases.items():
            started = time.perf_counter()
            for _ in range(2000):
                check(user, password)
            fastest[name] = min(fastest[name], time.perf_counter() - started)
    return fastest


def test_password_check_takes_as_long_for_an_unknown_user_as_for_a_wrong_password():
    """Measured: Gradio's own check (`user in table and compare_digest(...)`) answers an unknown
    user in 42 ns and a wrong password in 139 ns here, which tells a guesser which users exist."""
    check = password_checker([("ann", "a-long-enough-password"), ("bob", "another-password")])
    cases = {"unknown user": ("zed", "x"), "wrong password": ("ann", "y"), "right": ("ann", "a-long-enough-password")}
    # The leak this guards against was 3.3x, in every measurement; 1.5 leaves room for a loaded machine,
    # and a second and third measurement for a burst of load that outlasts one (a leak fails all three).
    for _ in range(3):
        fastest = _fastest_per_case(check, cases)
        print({name: f"{1e9 * t / 2000:.0f} ns" for name, t in fastest.items()})
        if max(fastest.values()) / min(fastest.values()) < 1.5:
            return
    raise AssertionError(f"the check's time depends on which part is wrong: {fastest}")
