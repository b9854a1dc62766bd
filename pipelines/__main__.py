from pipelines.launch.pipes_child import leave  # first: its exit handler must be registered before those of the CLI's imports
from pipelines.cli import main

leave(main())  # without Python's teardown, which the user would wait for after everything is written and printed
