"""Run by tests/test_settings.py in a pytest of its own (not collected with the suite): a test
whose thread keeps its database connection open to the end of the run, as the threads of
sync_to_async and of the race tests' pools do."""

import threading


def test_a_thread_keeps_its_connection_open(transactional_db):
    from eventbus.models import Job

    queried = threading.Event()

    def hold():
        Job.objects.count()
        queried.set()
        threading.Event().wait()  # alive, its connection open, until the process exits

    threading.Thread(target=hold, daemon=True).start()
    assert queried.wait(30)
