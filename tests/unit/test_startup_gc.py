"""After start-up the worker's collector leaves the objects it had alone and looks at the young less often."""

import gc

from app.faust_app import GC_YOUNG_THRESHOLD, freeze_startup_objects


def test_startup_objects_are_frozen_and_the_young_generation_collected_less_often():
    before = gc.get_threshold()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert GC_YOUNG_THRESHOLD > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
