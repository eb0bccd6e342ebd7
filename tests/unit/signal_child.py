"""A process whose main thread spins on the stop event: each SIGTERM must set it (the child
clears it and counts), however often the signal lands while the main thread is inside
Event.wait. (A handler calling ``stop.set()`` itself hangs within a few hundred signals here.)"""

from dfpubsub.console import stop_on_signals

stop = stop_on_signals()
print("0", flush=True)
count = 0
while True:
    if stop.wait(0.0001):
        stop.clear()
        count += 1
        print(count, flush=True)
