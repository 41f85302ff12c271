from arcvllm.cli import main

raise SystemExit(main())
