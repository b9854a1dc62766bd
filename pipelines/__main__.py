from pipelines.cli import main
from pipelines.pipes_child import leave

leave(main())  # without Python's teardown, which the user would wait for after everything is written and printed
