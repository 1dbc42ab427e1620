-- Each worker declares its own rescue_after: a holder is judged silent by
-- the window it promised, not by the rescuer's (workers with different
-- settings share one database). NULL for workers of older versions: rescuers
-- assume their own setting, and at least the default (config.holder_window).
ALTER TABLE jobkeeper_workers ADD COLUMN rescue_after REAL
    CHECK (rescue_after IS NULL OR rescue_after > 0);
