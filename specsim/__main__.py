from specsim.cli import main

raise SystemExit(main())
