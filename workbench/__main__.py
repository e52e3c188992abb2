from workbench.front.cli import main

raise SystemExit(main())
